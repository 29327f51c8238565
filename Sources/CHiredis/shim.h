// CHiredis: Debian's libhiredis-dev 0.14, from the default include path (Package.swift says why not through
// pkg-config). FanoutRedis is the only Swift module that
// imports it. Written against 0.14's API: RESP2 only, no redisAsyncSetTimeout (FanoutRedis arms its own timers), no
// hiredis_ssl (Debian builds hiredis 0.14 without TLS, so there is no rediss://).
//
// The async API only: FanoutRedis binds hiredis's event hooks to a uv_poll_t itself rather than through 0.14's
// adapters/libuv.h, which ignores poll errors (RedisConnection.swift says why).
//
// hiredis.pc's Cflags carry -D_FILE_OFFSET_BITS=64, which this module does without: on 64-bit Linux off_t is 64 bits
// already, and no hiredis struct uses off_t.
#include <hiredis/hiredis.h>
#include <hiredis/async.h>

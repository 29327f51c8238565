// CHiredis: Debian's libhiredis-dev 0.14 through pkg-config ("hiredis"). FanoutRedis is the only Swift module that
// imports it. Written against 0.14's API: RESP2 only, no redisAsyncSetTimeout (FanoutRedis arms its own timers), no
// hiredis_ssl (Debian builds hiredis 0.14 without TLS, so there is no rediss://).
//
// The async API and its libuv adapter. adapters/libuv.h is header-only: its functions are `static`, compiled into
// FanoutRedis; it allocates one `redisLibuvEvents` (a uv_poll_t on the context's socket) per attached context and
// frees it in that handle's close callback, which hiredis triggers through `ev.cleanup` when the context is freed.
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libuv.h>

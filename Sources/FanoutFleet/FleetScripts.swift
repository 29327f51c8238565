import FanoutRedis

/// The fleet's Lua scripts. Each touches the keys of one job only (one hash tag), or the stream only, so each runs on
/// one Redis Cluster slot.
enum FleetScripts {
    /// Records a batch of results. KEYS: results hash, counts hash. ARGV: (position, line, outcome, retries)
    /// quadruples. A position that already has a result keeps it (HSETNX) and is not counted again: a notification
    /// sent twice (by a worker that died with it in flight, then by the one that resumed the shard) has one result
    /// line and one count. Returns how many were written.
    static let recordResults = RedisScript(
        """
        local written = 0
        for i = 1, #ARGV, 4 do
          if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
            redis.call('HINCRBY', KEYS[2], ARGV[i + 2], 1)
            local retries = tonumber(ARGV[i + 3])
            if retries > 0 then redis.call('HINCRBY', KEYS[2], 'retries', retries) end
            written = written + 1
          end
        end
        return written
        """)

    /// A shard's progress record: the positions in [start, start + count) with no result yet. KEYS: results hash.
    /// ARGV: start, count. The results hash is the record, so progress and results cannot disagree.
    static let missingPositions = RedisScript(
        """
        local missing = {}
        local first = tonumber(ARGV[1])
        for position = first, first + tonumber(ARGV[2]) - 1 do
          if redis.call('HEXISTS', KEYS[1], position) == 0 then missing[#missing + 1] = position end
        end
        return missing
        """)

    /// Marks a shard done once: KEYS: done set, counts hash, job hash, the shard's tokens. ARGV: shard number, payload
    /// encodings, demoted. The shard's engine counts are added only by the first completion (a shard finished again
    /// after a claim adds nothing); its tokens are deleted (its results hold them); the job's last shard sets
    /// `finished_at` (Unix ms, the server's clock). Returns 1 when this call marked it.
    static let completeShard = RedisScript(
        """
        redis.call('DEL', KEYS[4])
        if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
        local encodings = tonumber(ARGV[2])
        if encodings > 0 then redis.call('HINCRBY', KEYS[2], 'payload_encodings', encodings) end
        local demoted = tonumber(ARGV[3])
        if demoted > 0 then redis.call('HINCRBY', KEYS[2], 'demoted', demoted) end
        local shards = tonumber(redis.call('HGET', KEYS[3], 'shards') or '-1')
        if redis.call('SCARD', KEYS[1]) == shards then
          local now = redis.call('TIME')
          redis.call('HSET', KEYS[3], 'finished_at', now[1] * 1000 + math.floor(now[2] / 1000))
        end
        return 1
        """)

    /// The heartbeat: resets the idle time of the entries this consumer still owns, so that no other worker's
    /// XAUTOCLAIM takes them. KEYS: the stream. ARGV: group, consumer, entry ids. An entry another consumer has
    /// claimed meanwhile is left to it (a plain XCLAIM with min-idle 0 would take it back). Returns the ids still
    /// owned.
    static let heartbeat = RedisScript(
        """
        local owned = {}
        for i = 3, #ARGV do
          local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
          if pending[1] ~= nil and pending[1][2] == ARGV[2] then
            redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
            owned[#owned + 1] = ARGV[i]
          end
        end
        return owned
        """)
}

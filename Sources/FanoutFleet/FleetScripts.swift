package import FanoutRedis

/// The fleet's Lua scripts. Each touches the keys of one job only (one hash tag), or the stream only, so each runs on
/// one Redis Cluster slot.
package enum FleetScripts {
    /// Records a batch of one shard's results. KEYS: the shard's marks, the shard's results, the counts hash. ARGV:
    /// the shard's start and count; the positions, space-separated; their records, `POSITION LINE` each (the line
    /// ends in a newline), in the same order; then (outcome, count) pairs and `retries`, for the whole batch.
    ///
    /// The marks are one byte per position of the shard, `1` once it has a result: a position already marked keeps
    /// its first line and is not counted again, so a notification sent twice (by a worker that died with it in flight,
    /// then by the one that resumed the shard) has one result line and one count. When every position of the batch is
    /// new (always, but after a claim or a late write), the records are appended as they came and the counts added as
    /// given; otherwise only the new positions' records are kept, and counted from their lines. So a batch costs a
    /// handful of Redis calls and one pass over its positions, whatever its size (an HSETNX and an HINCRBY per result
    /// would cost two calls per notification, and about three times Redis's CPU). Returns how many were written.
    static let recordResults = RedisScript(
        """
        local first = tonumber(ARGV[1])
        local size = tonumber(ARGV[2])
        local marks = redis.call('GET', KEYS[1]) or string.rep('0', size)
        local offsets = {}
        local seen = {}
        local all = true
        for position in string.gmatch(ARGV[3], '%d+') do
          local offset = tonumber(position) - first + 1
          if offset >= 1 and offset <= size and not seen[offset] and string.byte(marks, offset) ~= 49 then
            seen[offset] = true
            offsets[#offsets + 1] = offset
          else
            all = false
          end
        end
        local written = #offsets
        if written > 0 then
          table.sort(offsets)
          local parts = {}
          local from = 1
          for _, offset in ipairs(offsets) do
            parts[#parts + 1] = string.sub(marks, from, offset - 1)
            parts[#parts + 1] = '1'
            from = offset + 1
          end
          parts[#parts + 1] = string.sub(marks, from)
          redis.call('SET', KEYS[1], table.concat(parts))
        end
        if all then
          if written > 0 then redis.call('APPEND', KEYS[2], ARGV[4]) end
          for i = 5, #ARGV, 2 do redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1]) end
          return written
        end
        -- Some positions already had a result: keep only the records of the fresh ones, and count those.
        local records = {}
        local counts = {}
        local retries = 0
        for record in string.gmatch(ARGV[4], '[^\\n]+\\n') do
          local offset = tonumber(string.match(record, '^%d+')) - first + 1
          if seen[offset] then
            seen[offset] = nil
            records[#records + 1] = record
            local outcome = string.match(record, '"outcome":"([%w_]+)"')
            counts[outcome] = (counts[outcome] or 0) + 1
            retries = retries + math.max(0, tonumber(string.match(record, '"attempts":(%d+)')) - 1)
          end
        end
        if #records > 0 then redis.call('APPEND', KEYS[2], table.concat(records)) end
        for outcome, count in pairs(counts) do redis.call('HINCRBY', KEYS[3], outcome, count) end
        if retries > 0 then redis.call('HINCRBY', KEYS[3], 'retries', retries) end
        return #records
        """)

    /// Records the job-level result (a job line this version cannot parse) once. KEYS: the results hash, the counts
    /// hash. ARGV: line, outcome, retries. Returns 1 when written.
    static let recordJobResult = RedisScript(
        """
        if redis.call('HSETNX', KEYS[1], 'invalid', ARGV[1]) == 0 then return 0 end
        redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
        if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[2], 'retries', ARGV[3]) end
        return 1
        """)

    /// Marks a shard done once. KEYS: done set, counts hash, job hash, the shard's tokens, the shard's marks, the
    /// job's results hash. ARGV: shard number, payload encodings, demoted, broadcasts (1 for an activity's broadcast
    /// shard), and the progress the worker has seen recorded: how many positions of the shard it found marked or
    /// marked itself, and 1 when the job-level result is recorded. The shard's engine counts are added only by the
    /// first completion (a shard finished again after a claim adds nothing); its tokens are deleted (its results hold
    /// them); the job's last shard sets `finished_at` (Unix ms, the server's clock). Returns 1 when this call marked
    /// it, 0 when it was done already, and -1 (nothing changed) when Redis holds less progress than the worker saw
    /// recorded: a failover lost writes the old primary had acknowledged (replication is asynchronous), and the
    /// positions they covered must be sent again before the shard is done.
    static let completeShard = RedisScript(
        """
        local marked = tonumber(ARGV[5] or '0')
        if marked > 0 then
          local _, found = string.gsub(redis.call('GET', KEYS[5]) or '', '1', '')
          if found < marked then return -1 end
        end
        if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[6], 'invalid') == 0 then return -1 end
        redis.call('DEL', KEYS[4])
        if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
        local encodings = tonumber(ARGV[2])
        if encodings > 0 then redis.call('HINCRBY', KEYS[2], 'payload_encodings', encodings) end
        local demoted = tonumber(ARGV[3])
        if demoted > 0 then redis.call('HINCRBY', KEYS[2], 'demoted', demoted) end
        local broadcasts = tonumber(ARGV[4] or '0')
        if broadcasts > 0 then redis.call('HINCRBY', KEYS[2], 'broadcasts', broadcasts) end
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
    package static let heartbeat = RedisScript(
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

import FanoutRedis

/// The registry's Lua scripts. Each touches the keys of one hash tag only: one activity (`activity`) or one app
/// (`app`), or the global keys (`eventLog`, `pruneEvents`), so each runs on one Redis Cluster slot.
///
/// Records are JSON (`cjson`) with every number as a string, so that a millisecond time never goes through Lua's
/// 14-digit number formatting. A write script returns `{unchanged, expired_swept, removed, events, gone_tokens,
/// gone_devices}`: `events` flat quadruples (change, reason or "", token, device or ""), `gone_tokens` the tokens no
/// longer held where the script ran (for the global token index), `gone_devices` the devices whose slot went away
/// (for the app's device → activities index).
enum RedisRegistryScripts {
    /// One activity. KEYS: meta (hash), tokens (sorted set: slot → expiry), slots (hash: slot → record), devices
    /// (hash: device → slot), bytoken (hash: token → its slots), order (sorted set: slot → position). ARGV: operation,
    /// now, then the operation's own.
    ///
    /// Slots are zero-padded decimal numbers from the activity's `next` counter. Pages read the tokens in the order of
    /// their positions, which come from the same counter: a new slot's is its own number, a rotation gives the slot a
    /// new one (the end, so a send still paging reaches the new token), and a token registered again or taken over by
    /// a device keeps its own (a send that read it does not read it again), as SQLiteRegistryStore's row ids do. A
    /// registry written before the order set existed has it rebuilt (each slot at its own number) at its first page.
    static let activity = RedisScript(
        """
        local meta, tokens, slots, devices, bytoken, order = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
        local op = ARGV[1]
        local now = tonumber(ARGV[2])
        local events, candidates, gonedevices = {}, {}, {}
        local unchanged, expiredswept, removed = 0, 0, 0
        local function event(change, reason, token, device)
          events[#events + 1] = change
          events[#events + 1] = reason
          events[#events + 1] = token
          events[#events + 1] = device or ''
          if change ~= 'added' then candidates[#candidates + 1] = token end
        end
        local function ensure()
          if redis.call('EXISTS', meta) == 0 then
            redis.call('HSET', meta, 'state', 'active', 'created', ARGV[2], 'updated', ARGV[2], 'next', 0)
          end
        end
        local function load(slot)
          local raw = redis.call('HGET', slots, slot)
          if not raw then return nil end
          return cjson.decode(raw)
        end
        -- bytoken holds each token's slots, space-separated in slot order (two devices may hold one token).
        local function slotsof(token)
          local list = {}
          local raw = redis.call('HGET', bytoken, token)
          if raw then
            for slot in string.gmatch(raw, '%d+') do list[#list + 1] = slot end
          end
          return list
        end
        local function addslot(token, slot)
          local list = slotsof(token)
          for _, other in ipairs(list) do
            if other == slot then return end
          end
          list[#list + 1] = slot
          table.sort(list)
          redis.call('HSET', bytoken, token, table.concat(list, ' '))
        end
        local function delslot(token, slot)
          local kept = {}
          for _, other in ipairs(slotsof(token)) do
            if other ~= slot then kept[#kept + 1] = other end
          end
          if #kept == 0 then
            redis.call('HDEL', bytoken, token)
          else
            redis.call('HSET', bytoken, token, table.concat(kept, ' '))
          end
        end
        -- position: the slot's new place in the paging order (a new slot, a rotation); nil keeps its place (one
        -- saved before the order set existed gets its own number, as the rebuild gives it).
        local function save(slot, rec, position)
          redis.call('HSET', slots, slot, cjson.encode(rec))
          redis.call('ZADD', tokens, rec.e, slot)
          if position then
            redis.call('ZADD', order, position, slot)
          else
            redis.call('ZADD', order, 'NX', tonumber(slot), slot)
          end
        end
        local function position(slot)
          return tonumber(redis.call('ZSCORE', order, slot) or slot)
        end
        -- The token's slot first in the paging order (a registration without a device finds its slot by its token,
        -- and SQLiteRegistryStore takes the smallest row id).
        local function firstslot(token)
          local first, at
          for _, slot in ipairs(slotsof(token)) do
            local here = position(slot)
            if not at or here < at then first, at = slot, here end
          end
          return first
        end
        local function drop(slot, rec)
          redis.call('ZREM', tokens, slot)
          redis.call('ZREM', order, slot)
          redis.call('HDEL', slots, slot)
          delslot(rec.t, slot)
          if rec.d ~= '' and redis.call('HGET', devices, rec.d) == slot then
            redis.call('HDEL', devices, rec.d)
            gonedevices[#gonedevices + 1] = rec.d
          end
          removed = removed + 1
        end
        -- The slot holding token live without a device, or nil.
        local function anonymous(token)
          for _, other in ipairs(slotsof(token)) do
            local rec = load(other)
            if rec and rec.d == '' and tonumber(rec.e) > now then return other, rec end
          end
          return nil
        end
        -- A device's registration takes over that slot, keeping its position: one token, one slot, and a send that
        -- read the token does not read it again.
        local function takeover(slot, rec, device)
          rec.d, rec.r, rec.e = device, ARGV[5], ARGV[6]
          save(slot, rec)
          redis.call('HSET', devices, device, slot)
        end
        -- A device's registration drops the same token registered without a device, expired (a live one is taken
        -- over).
        local function absorb(token, except)
          for _, other in ipairs(slotsof(token)) do
            if other ~= except then
              local rec = load(other)
              if rec and rec.d == '' then
                drop(other, rec)
                removed = removed - 1
                return true
              end
            end
          end
          return false
        end
        local function dropall(reason, dismissal)
          local list = redis.call('ZRANGE', tokens, 0, -1)
          for _, slot in ipairs(list) do
            local rec = load(slot)
            if rec then
              drop(slot, rec)
              local why = reason
              if reason == 'stopped' and tonumber(rec.e) <= now then
                why = 'expired'
                expiredswept = expiredswept + 1
              end
              event('removed', why, rec.t, rec.d)
            end
          end
          return #list
        end
        -- Extra reply of stop, end and remove: 1 when they took the activity's last token (the sweep should visit it
        -- now: it may be idle already, while its schedule still says the removed token's expiry).
        local function emptied()
          if removed > 0 and redis.call('ZCARD', tokens) == 0 then return {1} end
          return {0}
        end
        local function finish(extra)
          local gone = {}
          for _, token in ipairs(candidates) do
            if redis.call('HEXISTS', bytoken, token) == 0 then gone[#gone + 1] = token end
          end
          local reply = {unchanged, expiredswept, removed, events, gone, gonedevices}
          if extra then
            for _, value in ipairs(extra) do reply[#reply + 1] = value end
          end
          return reply
        end

        if op == 'register' then
          -- Extra reply: 1 when the activity is dismissed already (the sweep should visit it now, not at the expiry).
          local device, token, registered = ARGV[3], ARGV[4], tonumber(ARGV[5])
          ensure()
          local fields = redis.call('HMGET', meta, 'state', 'dismissal', 'ended')
          local dismissed = {0}
          if fields[1] == 'ended' and fields[2] and tonumber(fields[2]) <= now then dismissed = {1} end
          -- A new token registered after the activity ended is a new session under the same id: live again, as
          -- 'start' makes it (SQLiteRegistryStore's reopenIfEnded says why).
          local function reopen()
            if fields[1] == 'ended' and fields[3] and registered > tonumber(fields[3]) then
              redis.call('HSET', meta, 'state', 'active', 'updated', ARGV[2])
              redis.call('HDEL', meta, 'ended', 'dismissal')
              fields[1] = 'active'
              dismissed = {0}
            end
          end
          local slot
          if device ~= '' then slot = redis.call('HGET', devices, device) else slot = firstslot(token) end
          local rec = slot and load(slot)
          if not rec then
            if device ~= '' then
              local other, held = anonymous(token)
              if other then
                takeover(other, held, device)
                unchanged = unchanged + 1
                return finish(dismissed)
              end
            end
            local absorbed = device ~= '' and absorb(token, nil)
            local number = redis.call('HINCRBY', meta, 'next', 1)
            slot = string.format('%012d', number)
            save(slot, {t = token, d = device, r = ARGV[5], e = ARGV[6]}, number)
            addslot(token, slot)
            if device ~= '' then redis.call('HSET', devices, device, slot) end
            if absorbed then unchanged = unchanged + 1 else reopen() event('added', '', token, device) end
            return finish(dismissed)
          end
          local change = 'rotated'
          local old, oldregistered = rec.t, tonumber(rec.r)
          if tonumber(rec.e) <= now then
            -- Dead but not swept yet: reported expired, then the registration fills the empty slot. The event names
            -- the registration's device, as SQLiteRegistryStore's does.
            event('removed', 'expired', rec.t, device)
            expiredswept = expiredswept + 1
            old, oldregistered, change = '', -math.huge, 'added'
          end
          local newer
          if token == old then newer = registered > oldregistered else newer = registered >= oldregistered end
          if not newer then
            unchanged = unchanged + 1
            return finish(dismissed)
          end
          if rec.t ~= token then
            delslot(rec.t, slot)
            candidates[#candidates + 1] = rec.t
            reopen()
            if device ~= '' then
              -- A rotation to a token held without a device takes that slot over (its position too); the device's
              -- own slot goes.
              local other, held = anonymous(token)
              if other then
                redis.call('ZREM', tokens, slot)
                redis.call('ZREM', order, slot)
                redis.call('HDEL', slots, slot)
                takeover(other, held, device)
                event(change, '', token, device)
                return finish(dismissed)
              end
              absorb(token, slot)
            end
          end
          rec.t, rec.r, rec.e = token, ARGV[5], ARGV[6]
          -- The same token registered again keeps its position; a new one (a rotation, or a dead slot filled) gets
          -- the next, so a send still paging reaches it.
          local moved
          if token ~= old then moved = redis.call('HINCRBY', meta, 'next', 1) end
          save(slot, rec, moved)
          addslot(token, slot)
          if token == old then unchanged = unchanged + 1 else event(change, '', token, device) end
          return finish(dismissed)

        elseif op == 'stop' then
          local device = ARGV[3]
          if redis.call('EXISTS', meta) == 0 then
            unchanged = 1
            return finish(emptied())
          end
          if device == '' then
            dropall('stopped')
          else
            local slot = redis.call('HGET', devices, device)
            local rec = slot and load(slot)
            if rec then
              drop(slot, rec)
              if tonumber(rec.e) <= now then
                expiredswept = expiredswept + 1
                event('removed', 'expired', rec.t, rec.d)
              else
                event('removed', 'stopped', rec.t, rec.d)
              end
            end
          end
          if removed == 0 then unchanged = 1 end
          return finish(emptied())

        elseif op == 'start' then
          ensure()
          redis.call('HSET', meta, 'state', 'active', 'updated', ARGV[2])
          redis.call('HDEL', meta, 'ended', 'dismissal')
          if ARGV[3] ~= '' then redis.call('HSET', meta, 'attributes', ARGV[3]) end
          return finish()

        elseif op == 'end' then
          if redis.call('EXISTS', meta) == 0 then return finish() end
          local dismissal = ARGV[3]
          redis.call('HSET', meta, 'state', 'ended', 'dismissal', dismissal, 'updated', ARGV[2])
          redis.call('HSETNX', meta, 'ended', ARGV[2])
          if tonumber(dismissal) <= now then dropall('ended') end
          return finish(emptied())

        elseif op == 'content' then
          ensure()
          local current = redis.call('HGET', meta, 'content')
          if not current or tonumber(ARGV[3]) > tonumber(current) then redis.call('HSET', meta, 'content', ARGV[3]) end
          redis.call('HSET', meta, 'updated', ARGV[2])
          return finish()

        elseif op == 'channel' then
          ensure()
          -- ARGV[5] '1': bind only an activity that has no channel yet.
          if ARGV[5] == '1' and redis.call('HEXISTS', meta, 'channel') == 1 then return finish() end
          if ARGV[3] == '' then redis.call('HDEL', meta, 'channel') else redis.call('HSET', meta, 'channel', ARGV[3]) end
          if ARGV[3] == '' or ARGV[4] == nil or ARGV[4] == '' then
            redis.call('HDEL', meta, 'channelpolicy')
          else
            redis.call('HSET', meta, 'channelpolicy', ARGV[4])
          end
          -- ARGV[6]: where the channel was created ('' unknown).
          if ARGV[3] == '' or ARGV[6] == nil or ARGV[6] == '' then
            redis.call('HDEL', meta, 'channelenv')
          else
            redis.call('HSET', meta, 'channelenv', ARGV[6])
          end
          redis.call('HSET', meta, 'updated', ARGV[2])
          return finish()

        elseif op == 'remove' then
          -- ARGV: token, before ('' = whatever its registration time; for a 410, its timestamp).
          local token = ARGV[3]
          candidates[#candidates + 1] = token
          for _, slot in ipairs(slotsof(token)) do
            local rec = load(slot)
            if rec and rec.t == token and (ARGV[4] == '' or tonumber(rec.r) < tonumber(ARGV[4])) then
              drop(slot, rec)
              event('removed', 'unregistered', rec.t, rec.d)
            end
          end
          return finish(emptied())

        elseif op == 'sweep' then
          -- ARGV: batch, lifetime. Extra replies: expired, ended, activities removed, next visit (-1: none; -2: the
          -- activity is gone).
          local batch, lifetime = tonumber(ARGV[3]), tonumber(ARGV[4])
          local expired, ended, gone = 0, 0, 0
          local more = false
          local fields = redis.call('HMGET', meta, 'state', 'dismissal', 'channel', 'updated')
          local state, dismissal, channel, updated = fields[1], tonumber(fields[2]), fields[3], tonumber(fields[4])
          if not state and redis.call('ZCARD', tokens) == 0 then
            return finish({0, 0, 0, -2})
          end
          local function clear()
            redis.call('DEL', meta, tokens, slots, devices, bytoken, order)
            gone = 1
          end
          if state == 'ended' and dismissal and dismissal <= now then
            local list = redis.call('ZRANGE', tokens, 0, batch - 1)
            for _, slot in ipairs(list) do
              local rec = load(slot)
              if rec then
                drop(slot, rec)
                if tonumber(rec.e) <= dismissal then
                  expired = expired + 1
                  expiredswept = expiredswept + 1
                  event('removed', 'expired', rec.t, rec.d)
                else
                  ended = ended + 1
                  event('removed', 'ended', rec.t, rec.d)
                end
              end
            end
            if #list < batch then
              -- One bound to a broadcast channel stays until the channel is deleted at APNs and unbound.
              if not channel then clear() end
            else
              more = true
            end
          else
            local list = redis.call('ZRANGEBYSCORE', tokens, '-inf', ARGV[2], 'LIMIT', 0, batch)
            for _, slot in ipairs(list) do
              local rec = load(slot)
              if rec then
                drop(slot, rec)
                expired = expired + 1
                expiredswept = expiredswept + 1
                event('removed', 'expired', rec.t, rec.d)
              end
            end
            if #list == batch then
              more = true
            elseif state ~= 'ended' and not channel and redis.call('ZCARD', tokens) == 0
              and (not updated or updated <= now - lifetime) then
              clear()
            end
          end
          local nextvisit = -1
          if gone == 1 then
            nextvisit = -2
          elseif more then
            nextvisit = now
          else
            local function candidate(at)
              if at and (nextvisit < 0 or at < nextvisit) then nextvisit = at end
            end
            local first = redis.call('ZRANGE', tokens, 0, 0, 'WITHSCORES')
            if first[2] then candidate(tonumber(first[2])) end
            if state == 'ended' and dismissal and dismissal > now then candidate(dismissal) end
            if state ~= 'ended' and not channel and not first[2] then candidate((updated or now) + lifetime) end
          end
          return finish({expired, ended, gone, nextvisit})

        elseif op == 'page' then
          -- ARGV: cursor position (0: the start), limit. Reply: flat (position, record) pairs, the slots after the
          -- cursor in position order, each with its record as stored (JSON; nil for a slot gone meanwhile). The
          -- reader decodes the records and skips the expired ones: the script makes two calls per page instead of
          -- a call and a decode per token, because every other client of Redis waits while it runs.
          if redis.call('EXISTS', meta) == 0 then return {} end
          local fields = redis.call('HMGET', meta, 'state', 'dismissal')
          if fields[1] == 'ended' and fields[2] and tonumber(fields[2]) <= now then return {} end
          if redis.call('ZCARD', order) ~= redis.call('ZCARD', tokens) then
            -- Written before the order set existed (or by such a Fanout since): each slot missing from it goes at
            -- its own number, its creation order, and a slot removed meanwhile leaves it. Once: the two then agree.
            for _, slot in ipairs(redis.call('ZRANGE', tokens, 0, -1)) do
              redis.call('ZADD', order, 'NX', tonumber(slot), slot)
            end
            for _, slot in ipairs(redis.call('ZRANGE', order, 0, -1)) do
              if not redis.call('ZSCORE', tokens, slot) then redis.call('ZREM', order, slot) end
            end
          end
          local batch = redis.call('ZRANGEBYSCORE', order, '(' .. ARGV[3], '+inf', 'WITHSCORES', 'LIMIT', 0,
            tonumber(ARGV[4]))
          local slotids = {}
          for i = 1, #batch, 2 do slotids[#slotids + 1] = batch[i] end
          local out = {}
          -- HMGET in chunks: unpack's arguments go on Lua's C stack, which holds some 8,000.
          for first = 1, #slotids, 1000 do
            local last = math.min(first + 999, #slotids)
            local records = redis.call('HMGET', slots, unpack(slotids, first, last))
            for j = 1, #records do
              out[#out + 1] = batch[2 * (first + j - 1)]
              out[#out + 1] = records[j]
            end
          end
          return out

        elseif op == 'count' then
          if redis.call('EXISTS', meta) == 0 then return 0 end
          local fields = redis.call('HMGET', meta, 'state', 'dismissal')
          if fields[1] == 'ended' and fields[2] and tonumber(fields[2]) <= now then return 0 end
          return redis.call('ZCOUNT', tokens, '(' .. ARGV[2], '+inf')

        elseif op == 'get' then
          if redis.call('EXISTS', meta) == 0 then return {} end
          local fields = redis.call(
            'HMGET', meta, 'attributes', 'state', 'content', 'ended', 'dismissal', 'channel', 'channelpolicy',
            'channelenv')
          for i = 1, 8 do if not fields[i] then fields[i] = '' end end
          fields[9] = 'exists'
          return fields

        elseif op == 'stat' then
          -- Reply: exists, ended, has channel, dismissed, live tokens.
          if redis.call('EXISTS', meta) == 0 then return {0, 0, 0, 0, 0} end
          local fields = redis.call('HMGET', meta, 'state', 'dismissal', 'channel')
          local ended = fields[1] == 'ended' and 1 or 0
          local dismissed = (ended == 1 and fields[2] and tonumber(fields[2]) <= now) and 1 or 0
          local live = 0
          if dismissed == 0 then live = redis.call('ZCOUNT', tokens, '(' .. ARGV[2], '+inf') end
          return {1, ended, fields[3] and 1 or 0, dismissed, live}

        elseif op == 'devslot' then
          -- ARGV: device. Reply: (registered, token, expiry) of the device's live token, or empty.
          if redis.call('EXISTS', meta) == 0 then return {} end
          local fields = redis.call('HMGET', meta, 'state', 'dismissal')
          if fields[1] == 'ended' and fields[2] and tonumber(fields[2]) <= now then return {} end
          local slot = redis.call('HGET', devices, ARGV[3])
          local rec = slot and load(slot)
          if not rec or tonumber(rec.e) <= now then return {} end
          return {rec.r, rec.t, rec.e}
        end
        return redis.error_reply('unknown registry operation ' .. tostring(op))
        """)

    /// One app's devices and push-to-start tokens. KEYS: meta (hash: counters), devices (hash: device → record),
    /// device order (sorted set: device by creation number), user index (sorted set, one score, members
    /// `len:user` + number + device), push-to-start (hash: `[device, type]` → record), push-to-start order (sorted set),
    /// push-to-start by user, push-to-start by device (sorted sets like the user index), device activities (sorted
    /// set, one score, members `len:device` + activity id). ARGV: operation, now, then the operation's own.
    static let app = RedisScript(
        """
        local meta, devices, devorder, userdev = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
        local pts, ptsorder, ptsuser, ptsdev, devact = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
        local op = ARGV[1]
        local now = tonumber(ARGV[2])
        local events, gone = {}, {}
        local unchanged, removed = 0, 0
        local function prefix(text) return #text .. ':' .. text end
        local function number(n) return string.format('%012d', n) end
        local function event(change, reason, token, device)
          events[#events + 1] = change
          events[#events + 1] = reason
          events[#events + 1] = token
          events[#events + 1] = device
          if change ~= 'added' then removed = removed + (change == 'removed' and 1 or 0) end
        end
        local function finish()
          return {unchanged, 0, removed, events, gone, {}}
        end
        local function savedevice(device, rec) redis.call('HSET', devices, device, cjson.encode(rec)) end
        -- Records that the device exists and (when given) belongs to user.
        local function touch(device, user)
          local raw = redis.call('HGET', devices, device)
          if not raw then
            local n = redis.call('HINCRBY', meta, 'device_number', 1)
            redis.call('HINCRBY', meta, 'devices', 1)
            local rec = {s = number(n), u = user, p = '', a = ''}
            savedevice(device, rec)
            redis.call('ZADD', devorder, n, device)
            if user ~= '' then redis.call('ZADD', userdev, 0, prefix(user) .. rec.s .. device) end
            return rec
          end
          local rec = cjson.decode(raw)
          if user ~= '' and rec.u ~= user then
            if rec.u ~= '' then redis.call('ZREM', userdev, prefix(rec.u) .. rec.s .. device) end
            rec.u = user
            redis.call('ZADD', userdev, 0, prefix(user) .. rec.s .. device)
            savedevice(device, rec)
          end
          return rec
        end
        local function ptsfield(device, kind) return cjson.encode({device, kind}) end
        local function ptsremove(field, rec, device)
          redis.call('HDEL', pts, field)
          redis.call('ZREM', ptsorder, field)
          if rec.u ~= '' then redis.call('ZREM', ptsuser, prefix(rec.u) .. rec.s .. field) end
          redis.call('ZREM', ptsdev, prefix(device) .. rec.s .. field)
          redis.call('HINCRBY', meta, 'push_to_start', -1)
        end

        if op == 'touch' then
          -- ARGV: device, user, activity ('' for none).
          touch(ARGV[3], ARGV[4])
          if ARGV[5] ~= '' then redis.call('ZADD', devact, 0, prefix(ARGV[3]) .. ARGV[5]) end
          return finish()

        elseif op == 'untrack' then
          -- ARGV: (device, activity) pairs whose update token went.
          for i = 3, #ARGV, 2 do redis.call('ZREM', devact, prefix(ARGV[i]) .. ARGV[i + 1]) end
          return finish()

        elseif op == 'device' then
          -- ARGV: device, user, has push token ('1'/'0'), push token, registered.
          local device = ARGV[3]
          local rec = touch(device, ARGV[4])
          if ARGV[5] ~= '1' then return finish() end
          local token, at = ARGV[6], tonumber(ARGV[7])
          local old = rec.p
          if token == '' then
            if old == '' then
              unchanged = 1
            else
              rec.p, rec.a = '', ''
              savedevice(device, rec)
              event('removed', 'stopped', old, device)
              gone[#gone + 1] = old
            end
          elseif old == '' then
            rec.p, rec.a = token, ARGV[7]
            savedevice(device, rec)
            event('added', '', token, device)
          else
            local previous = rec.a ~= '' and tonumber(rec.a) or -math.huge
            local newer
            if old == token then newer = at > previous else newer = at >= previous end
            if not newer then
              unchanged = 1
            elseif old == token then
              rec.a = ARGV[7]
              savedevice(device, rec)
              unchanged = 1
            else
              rec.p, rec.a = token, ARGV[7]
              savedevice(device, rec)
              event('rotated', '', token, device)
              gone[#gone + 1] = old
            end
          end
          return finish()

        elseif op == 'pts' then
          -- ARGV: device, user, attributes type ('' for none), token ('' to remove), updated.
          local device, user, kind, token, at = ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
          local field = ptsfield(device, kind)
          if token == '' then
            local raw = redis.call('HGET', pts, field)
            if not raw then
              unchanged = 1
            else
              local rec = cjson.decode(raw)
              ptsremove(field, rec, device)
              event('removed', 'stopped', rec.t, device)
              gone[#gone + 1] = rec.t
            end
            return finish()
          end
          touch(device, user)
          local raw = redis.call('HGET', pts, field)
          if not raw then
            local n = redis.call('HINCRBY', meta, 'push_to_start_number', 1)
            redis.call('HINCRBY', meta, 'push_to_start', 1)
            local rec = {s = number(n), u = user, k = kind, t = token, a = ARGV[7]}
            redis.call('HSET', pts, field, cjson.encode(rec))
            redis.call('ZADD', ptsorder, n, field)
            if user ~= '' then redis.call('ZADD', ptsuser, 0, prefix(user) .. rec.s .. field) end
            redis.call('ZADD', ptsdev, 0, prefix(device) .. rec.s .. field)
            event('added', '', token, device)
            return finish()
          end
          local rec = cjson.decode(raw)
          local previous = tonumber(rec.a)
          local newuser = rec.u
          if user ~= '' then newuser = user end
          local changes = token ~= rec.t and at >= previous
          local refreshed = at > previous
          if not (changes or refreshed or newuser ~= rec.u) then
            unchanged = 1
            return finish()
          end
          if newuser ~= rec.u then
            if rec.u ~= '' then redis.call('ZREM', ptsuser, prefix(rec.u) .. rec.s .. field) end
            redis.call('ZADD', ptsuser, 0, prefix(newuser) .. rec.s .. field)
            rec.u = newuser
          end
          local old = rec.t
          if changes then rec.t = token end
          if at > previous then rec.a = ARGV[7] end
          redis.call('HSET', pts, field, cjson.encode(rec))
          if changes then
            event('rotated', '', token, device)
            gone[#gone + 1] = old
          else
            unchanged = 1
          end
          return finish()

        elseif op == 'remove' then
          -- ARGV: kind ('push' or 'push_to_start'), device, attributes type, token, before ('' = any time; for a
          -- 410, its timestamp).
          local kind, device, token = ARGV[3], ARGV[4], ARGV[6]
          local function older(at) return ARGV[7] == '' or (at ~= '' and tonumber(at) < tonumber(ARGV[7])) end
          if kind == 'push' then
            local raw = redis.call('HGET', devices, device)
            if raw then
              local rec = cjson.decode(raw)
              if rec.p == token and older(rec.a) then
                rec.p, rec.a = '', ''
                savedevice(device, rec)
                event('removed', 'unregistered', token, device)
              end
              if rec.p ~= token then gone[#gone + 1] = token end
            else
              gone[#gone + 1] = token
            end
          else
            local field = ptsfield(device, ARGV[5])
            local raw = redis.call('HGET', pts, field)
            if raw then
              local rec = cjson.decode(raw)
              if rec.t == token and older(rec.a) then
                ptsremove(field, rec, device)
                event('removed', 'unregistered', token, device)
                gone[#gone + 1] = token
              elseif rec.t ~= token then
                gone[#gone + 1] = token
              end
            else
              gone[#gone + 1] = token
            end
          end
          return finish()

        elseif op == 'devices' or op == 'pts_read' then
          -- ARGV: selection ('all', 'users', 'devices'), list index, number after, limit, attributes type filter
          -- ('' none; pts_read only), has filter ('1'/'0'), then the users or devices. Reply: {next index, next number
          -- (-1: no more), items...}; a device item is (number, device, user, push token, registered), a push-to-start
          -- item (number, device, user, type, token, updated).
          local selection, index, after, limit = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
          local filter, filtered = ARGV[7], ARGV[8] == '1'
          local items, count = {}, 0
          local isdevices = op == 'devices'
          local function emit(field)
            if isdevices then
              local raw = redis.call('HGET', devices, field)
              if not raw then return nil end
              local rec = cjson.decode(raw)
              items[#items + 1] = rec.s
              items[#items + 1] = field
              items[#items + 1] = rec.u
              items[#items + 1] = rec.p
              items[#items + 1] = rec.a
              count = count + 1
              return rec.s
            end
            local raw = redis.call('HGET', pts, field)
            if not raw then return nil end
            local rec = cjson.decode(raw)
            if filtered and rec.k ~= filter and rec.k ~= '' then return false end
            local key = cjson.decode(field)
            items[#items + 1] = rec.s
            items[#items + 1] = key[1]
            items[#items + 1] = rec.u
            items[#items + 1] = rec.k
            items[#items + 1] = rec.t
            items[#items + 1] = rec.a
            count = count + 1
            return rec.s
          end
          local lists = {}
          for i = 9, #ARGV do lists[#lists + 1] = ARGV[i] end
          if selection == 'all' then lists = {''} end
          while index < #lists do
            local last = after
            if selection == 'all' then
              local order = isdevices and devorder or ptsorder
              while count < limit do
                local batch = redis.call('ZRANGEBYSCORE', order, '(' .. last, '+inf', 'WITHSCORES', 'LIMIT', 0,
                  limit - count)
                if #batch == 0 then break end
                for i = 1, #batch, 2 do
                  last = tonumber(batch[i + 1])
                  emit(batch[i])
                end
              end
            elseif selection == 'devices' and isdevices then
              local device = lists[index + 1]
              local raw = redis.call('HGET', devices, device)
              if raw then
                local rec = cjson.decode(raw)
                if tonumber(rec.s) > last then
                  emit(device)
                  last = tonumber(rec.s)
                end
              end
            else
              local key = ptsdev
              if selection == 'users' then key = isdevices and userdev or ptsuser end
              local head = prefix(lists[index + 1])
              while count < limit do
                local batch = redis.call('ZRANGEBYLEX', key, '[' .. head .. number(last + 1), '[' .. head .. '\\255',
                  'LIMIT', 0, limit - count)
                if #batch == 0 then break end
                for _, member in ipairs(batch) do
                  local n = tonumber(string.sub(member, #head + 1, #head + 12))
                  last = n
                  emit(string.sub(member, #head + 13))
                end
              end
            end
            if count == limit then
              local reply = {index, last}
              for _, value in ipairs(items) do reply[#reply + 1] = value end
              return reply
            end
            index = index + 1
            after = 0
          end
          local reply = {index, -1}
          for _, value in ipairs(items) do reply[#reply + 1] = value end
          return reply

        elseif op == 'device_activities' then
          -- ARGV: device, after (activity id, '' for the start), limit. Reply: activity ids in order.
          local head = prefix(ARGV[3])
          local low = '[' .. head
          if ARGV[4] ~= '' then low = '(' .. head .. ARGV[4] end
          local batch = redis.call('ZRANGEBYLEX', devact, low, '[' .. head .. '\\255', 'LIMIT', 0, tonumber(ARGV[5]))
          local out = {}
          for _, member in ipairs(batch) do out[#out + 1] = string.sub(member, #head + 1) end
          return out

        elseif op == 'counts' then
          local fields = redis.call('HMGET', meta, 'devices', 'push_to_start')
          return {tonumber(fields[1] or '0'), tonumber(fields[2] or '0')}
        end
        return redis.error_reply('unknown registry operation ' .. tostring(op))
        """)

    /// Appends events to the log. KEYS: the events stream. ARGV: at, then (app, activity, device, token, kind, change,
    /// reason) septuples ('' for none). Entry ids are `0-N`, so N is the event's sequence number: increasing by one
    /// per event, never reused (the stream remembers its last id when entries are deleted). Returns the numbers.
    static let eventLog = RedisScript(
        """
        local numbers = {}
        for i = 2, #ARGV, 7 do
          local id = redis.call('XADD', KEYS[1], '0-*', 'at', ARGV[1], 'app', ARGV[i], 'activity', ARGV[i + 1],
            'device', ARGV[i + 2], 'token', ARGV[i + 3], 'kind', ARGV[i + 4], 'change', ARGV[i + 5],
            'reason', ARGV[i + 6])
          numbers[#numbers + 1] = tonumber(string.sub(id, 3))
        end
        return numbers
        """)

    /// Drops up to ARGV[2] of the oldest events at or before ARGV[1] (Unix ms), never the newest one. KEYS: the events
    /// stream. Returns how many.
    static let pruneEvents = RedisScript(
        """
        local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
        if not newest then return 0 end
        local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[2]))
        local cutoff = tonumber(ARGV[1])
        local pruned = 0
        for _, entry in ipairs(entries) do
          if entry[1] == newest[1] then break end
          local fields = entry[2]
          local at
          for i = 1, #fields, 2 do if fields[i] == 'at' then at = tonumber(fields[i + 1]) end end
          if not at or at > cutoff then break end
          redis.call('XDEL', KEYS[1], entry[1])
          pruned = pruned + 1
        end
        return pruned
        """)

    static let all = [activity, app, eventLog, pruneEvents]
}

"""The Lua prelude every shared-admission script starts with: the key names derived from the header, and the small
functions the scripts share (reading and writing tickets, events, the replicas' info, slot choice, usage counts).

`service.scaleout.redis_side.scripts` puts it (after `USAGE_CONSTANTS`) in front of every script body; the calling
convention and the invariants are in that module's docstring.
"""

from __future__ import annotations

from service.usage.ledger import USAGE_BUCKET_S, USAGE_RETENTION_S

__all__ = ["PRELUDE", "USAGE_CONSTANTS"]

USAGE_CONSTANTS = f"local UBUCKET, URETAIN = {USAGE_BUCKET_S * 1000}, {USAGE_RETENTION_S * 1000}\n"

PRELUDE = r"""
local P, BY, TTL, MAXLEN, PAYLOAD_TTL = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local QUEUE, QDL, HBDL, LIVE = P .. 'queue', P .. 'qdl', P .. 'hbdl', P .. 'live'
local REPLICAS, STREAM, LENGTHS = P .. 'replicas', P .. 'events', P .. 'lengths'
local SEQ, EPOCH, WATCH, SEEN = P .. 'seq', P .. 'epoch', P .. 'watch', P .. 'seen'
local ORPHANS, CKPT = P .. 'orphans', P .. 'ckpt:h:'
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local EVENTS, TAKEN, REAPED = {}, {}, {}

local function tkey(id) return P .. 't:' .. id end
local function pkey(id) return P .. 'p:' .. id end
local function hkey(r) return P .. 'held:' .. r end
local function rkey(r) return P .. 'replica:' .. r end
local function ukey(r) return P .. 'url:' .. r end
local function alive(r) return redis.call('EXISTS', rkey(r)) == 1 end
local function kqkey(owner) return P .. 'kq:' .. owner end
local function krkey(owner) return P .. 'kr:' .. owner end

-- Usage (docs/scale-out.md, §12): `amount` of `field` (r running ms, q queued ms, s sessions, c chunks, f frames)
-- for `owner`, in the wall-clock bucket that holds `at` (ms), and in the owner's all-time totals.
local function usage_add(owner, field, amount, at)
  if not owner or amount <= 0 then return end
  local bucket = at - at % UBUCKET
  local key, index = P .. 'u:' .. owner .. ':' .. bucket, P .. 'ub:' .. owner
  redis.call('HINCRBY', key, field, amount)
  if redis.call('ZADD', index, bucket, bucket) == 1 then
    redis.call('PEXPIRE', key, URETAIN + UBUCKET)
    redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. (NOW - URETAIN - UBUCKET))
  end
  redis.call('HINCRBY', P .. 'ut:' .. owner, field, amount)
  redis.call('SADD', P .. 'uowners', owner)
end

-- The span [from, to) ms of `field`, split at bucket edges.
local function usage_span(owner, field, from, to)
  from, to = tonumber(from), tonumber(to)
  if not from or not to then return end
  while from < to do
    local stop = math.min(from - from % UBUCKET + UBUCKET, to)
    usage_add(owner, field, stop - from, from)
    from = stop
  end
end

-- The admitted ticket's running time up to `to` (ms): from its mark `um` (or its admission); the mark moves there.
local function usage_run(id, to)
  local f = redis.call('HMGET', tkey(id), 'owner', 'um', 'admitted')
  local from = tonumber(f[2]) or tonumber(f[3])
  if from and to > from then
    usage_span(f[1], 'r', from, to)
    redis.call('HSET', tkey(id), 'um', to)
  end
end

-- A ticket left the queue at `at`: its wait counts.
local function usage_wait(id, at)
  local f = redis.call('HMGET', tkey(id), 'owner', 'created')
  usage_span(f[1], 'q', f[2], at)
end

-- The ticket now holds a slot: its owner's quota counts it as running (no longer queued).
local function count_running(id)
  local owner = redis.call('HGET', tkey(id), 'owner')
  redis.call('SREM', kqkey(owner), id)
  redis.call('SADD', krkey(owner), id)
end

-- "workers|slots|mask|draining|r0,r1,..|generation" -> {n, cap, mask, draining, reserved[1..n], gen}, or nil
local function parse_info(raw)
  if not raw then return nil end
  local n, cap, mask, d, res, gen = string.match(raw, '^(%d+)|(%d+)|([01]+)|([01])|([%d,]*)|(%d+)$')
  if not n then return nil end
  local info = {n = tonumber(n), cap = tonumber(cap), mask = mask, draining = d == '1', reserved = {},
    gen = tonumber(gen)}
  for x in string.gmatch(res, '%d+') do info.reserved[#info.reserved + 1] = tonumber(x) end
  for w = 1, info.n do info.reserved[w] = info.reserved[w] or 0 end
  return info
end
local ME = parse_info(ARGV[5])

-- Store BY's info unless a newer generation is stored (two calls of one replica may land out of order); either
-- way ME becomes the newer one.
local function sync_info()
  local stored = parse_info(redis.call('HGET', REPLICAS, BY))
  if stored and stored.gen > ME.gen then
    ME = stored
  else
    redis.call('HSET', REPLICAS, BY, ARGV[5])
  end
end

-- Sessions per worker of replica r (index 1..n), derived from its held slots.
local function loads(r, n)
  local counts = {}
  for w = 1, n do counts[w] = 0 end
  for _, w in ipairs(redis.call('HVALS', hkey(r))) do
    local i = tonumber(w) + 1
    counts[i] = (counts[i] or 0) + 1
  end
  return counts
end

-- The least-loaded healthy worker of r with a free slot (reserved slots count as used), ties to the lowest index.
local function pick(r, info)
  if not info or info.draining then return nil end
  local counts, best, best_used = loads(r, info.n), nil, nil
  for w = 1, info.n do
    local used = counts[w] + info.reserved[w]
    if string.sub(info.mask, w, w) == '1' and used < info.cap and (best == nil or used < best_used) then
      best, best_used = w, used
    end
  end
  if best then return best - 1 end
  return nil
end

local function free_slots(r, info)
  if not info or info.draining then return 0 end
  local counts, free = loads(r, info.n), 0
  for w = 1, info.n do
    if string.sub(info.mask, w, w) == '1' then free = free + math.max(0, info.cap - counts[w] - info.reserved[w]) end
  end
  return free
end

-- Replicas whose liveness key exists: id -> info.
local function live_replicas()
  local out, all = {}, redis.call('HGETALL', REPLICAS)
  for i = 1, #all, 2 do
    if alive(all[i]) then out[all[i]] = parse_info(all[i + 1]) end
  end
  return out
end

local function snapshot(id)
  local flat = redis.call('HGETALL', tkey(id))
  local rank = redis.call('ZRANK', QUEUE, id)
  if rank then
    flat[#flat + 1] = 'pos'
    flat[#flat + 1] = tostring(rank + 1)
  end
  return flat
end

-- One change of ticket `id`: bump its version, append it to the stream and to this call's reply.
local function emit(kind, id)
  redis.call('HINCRBY', tkey(id), 'v', 1)
  local entry, flat = {'k', kind, 'by', BY}, snapshot(id)
  for i = 1, #flat, 2 do
    if flat[i] ~= 'body' and flat[i] ~= 'ctok' then
      entry[#entry + 1] = flat[i]
      entry[#entry + 1] = flat[i + 1]
    end
  end
  redis.call('XADD', STREAM, 'MAXLEN', '~', MAXLEN, '*', unpack(entry))
  EVENTS[#EVENTS + 1] = entry
end

local function unqueue(id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', QDL, id)
  redis.call('ZREM', HBDL, id)
end

local function finish(id, state, reason, at)
  local owner = redis.call('HGET', tkey(id), 'owner')
  if owner then
    redis.call('SREM', kqkey(owner), id)
    redis.call('SREM', krkey(owner), id)
  end
  redis.call('ZREM', LIVE, id)
  redis.call('DEL', pkey(id))
  redis.call('HDEL', tkey(id), 'paused')  -- a finished session is paused no more
  redis.call('HSET', tkey(id), 'state', state, 'reason', reason, 'ended', at)
end

-- QUEUED -> EXPIRED | CANCELLED.
local function leave_queue(id, state, reason, at)
  usage_wait(id, at)
  unqueue(id)
  finish(id, state, reason, at)
  redis.call('HSET', tkey(id), 'status', state)
  emit(state, id)
  redis.call('PEXPIRE', tkey(id), TTL)
end

-- ADMITTED -> RELEASED: the slot on replica r goes back. With `failure` the session is lost (its replica died).
-- Its running time counts up to `upto` (ms; default now).
local function release_slot(id, r, failure, window, upto)
  local key = tkey(id)
  usage_run(id, upto or NOW)
  redis.call('HDEL', hkey(r), id)
  finish(id, 'released', 'session_ended', NOW)
  if failure then
    redis.call('HSET', key, 'failure', failure, 'status', 'failed', 'status_reason', failure)
    emit('lost', id)
  else
    local status = redis.call('HGET', key, 'status')
    if status ~= 'closed' and status ~= 'failed' then redis.call('HSET', key, 'status', 'closed') end
    local admitted = tonumber(redis.call('HGET', key, 'admitted'))
    if admitted then
      redis.call('LPUSH', LENGTHS, math.max(0, NOW - admitted))
      redis.call('LTRIM', LENGTHS, 0, window - 1)
    end
    emit('released', id)
  end
  redis.call('PEXPIRE', key, TTL)
end

-- Admit the queue head onto BY while BY is alive, not draining and has a free healthy slot, and no orphan waits
-- for one (orphans were admitted before anyone queued: they go first, through `adopt`).
local function admit_queued()
  if not ME or ME.draining or not alive(BY) or redis.call('ZCARD', ORPHANS) > 0 then return end
  while true do
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if not head then return end
    local w = pick(BY, ME)
    if w == nil then return end
    usage_wait(head, NOW)
    unqueue(head)
    redis.call('HSET', tkey(head), 'state', 'admitted', 'replica', BY, 'worker', w, 'admitted', NOW, 'status',
      'admitted')
    redis.call('HSET', hkey(BY), head, w)
    count_running(head)
    local payload = redis.call('GET', pkey(head))
    if payload then redis.call('PEXPIRE', pkey(head), PAYLOAD_TTL) end
    emit('admitted', head)
    TAKEN[#TAKEN + 1] = head
    TAKEN[#TAKEN + 1] = payload
  end
end

-- Expire every queued ticket whose queue or heartbeat deadline passed, earliest deadline first.
local function expire_due()
  while true do
    local q = redis.call('ZRANGE', QDL, 0, 0, 'WITHSCORES')
    local h = redis.call('ZRANGE', HBDL, 0, 0, 'WITHSCORES')
    local id, at, reason = nil, nil, nil
    if #q > 0 then id, at, reason = q[1], tonumber(q[2]), 'queue_timeout' end
    if #h > 0 and (at == nil or tonumber(h[2]) < at) then id, at, reason = h[1], tonumber(h[2]), 'heartbeat_lost' end
    if id == nil or at > NOW then return end
    leave_queue(id, 'expired', reason, at)
  end
end

local function next_deadline()
  local best = nil
  for _, zset in ipairs({QDL, HBDL}) do
    local head = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
    if #head > 0 and (best == nil or tonumber(head[2]) < best) then best = tonumber(head[2]) end
  end
  if best == nil then return -1 end
  return math.max(0, best - NOW)
end

local function is_orphan(id) return redis.call('ZSCORE', ORPHANS, id) ~= false end

-- The admitted session `id` leaves replica r's slot and waits in `orphans` (by its seq: the oldest admitted is
-- adopted first) for a replica to adopt it: its state stays admitted, its replica r until then. `why` is its status
-- reason meanwhile (replica_lost; replica_draining: r handed it off), also kept as `why`, which its adopter reads
-- (with `orphaned`: both outlive the adoption, unlike the status its adopter then publishes). `paused`: the
-- session was paused when r handed it off or was lost, since that time (ms, this clock), kept as `paused` for its
-- adopter, which goes on paused with the pause's deadline counted from there; nil (a running session): no `paused`.
local function orphan(id, r, why, paused)
  redis.call('HDEL', hkey(r), id)
  redis.call('ZADD', ORPHANS, redis.call('HGET', tkey(id), 'seq'), id)
  redis.call('HSET', tkey(id), 'orphaned', NOW, 'why', why, 'status', 'recovering', 'status_reason', why)
  if paused then redis.call('HSET', tkey(id), 'paused', paused) else redis.call('HDEL', tkey(id), 'paused') end
  emit('orphaned', id)
end

-- An orphan ends without an adopter: failed with `failure`, or closed (nil: its client stopped it meanwhile).
local function end_orphan(id, failure)
  local key = tkey(id)
  redis.call('ZREM', ORPHANS, id)
  finish(id, 'released', 'session_ended', NOW)
  redis.call('HDEL', key, 'orphaned')
  if failure then
    redis.call('HSET', key, 'failure', failure, 'status', 'failed', 'status_reason', failure)
    emit('lost', id)
  else
    redis.call('HSET', key, 'status', 'closed', 'status_reason', 'client_deleted')
    emit('released', id)
  end
  redis.call('PEXPIRE', key, TTL)
end

-- Every slot replica r holds is reclaimed; r leaves the registry. A session r marked adoptable (`ad`) whose
-- checkpoint and payload exist becomes an orphan (unless r leaves by itself), paused if the last status r published
-- of it was paused (its `paused`: its adopter goes on paused), any other is marked failed. Their
-- running time counts up to r's last heartbeat (the last moment it was known alive, kept as the ticket's `seen`;
-- now when r leaves by itself). This is one of the two places a session is declared lost with its replica (the
-- other: an orphan no replica adopted, in `adopt`): each failed ticket is added to REAPED once (the script is
-- atomic, so of several racing reapers exactly one releases it), and `maintain` returns them to its caller, which
-- sends their `session.ended`. An orphan is not declared lost here.
local function reap(r)
  local seen = tonumber(redis.call('HGET', SEEN, r)) or NOW
  if r == BY then seen = NOW end
  for _, id in ipairs(redis.call('HKEYS', hkey(r))) do
    local f = redis.call('HMGET', tkey(id), 'state', 'ad', 'paused')
    if f[1] == 'admitted' then
      redis.call('HSET', tkey(id), 'seen', math.min(seen, NOW))
      local whole = redis.call('EXISTS', CKPT .. id) == 1 and redis.call('EXISTS', pkey(id)) == 1
      if r ~= BY and f[2] == '1' and whole then
        usage_run(id, math.min(seen, NOW))
        orphan(id, r, 'replica_lost', f[3] or nil)
      else
        release_slot(id, r, 'replica_lost: ' .. r, nil, math.min(seen, NOW))
        REAPED[#REAPED + 1] = snapshot(id)
      end
    end
  end
  redis.call('DEL', hkey(r))
  redis.call('HDEL', REPLICAS, r)
  redis.call('HDEL', SEEN, r)
end

-- Whole seconds until some slot frees: mean recent session length / slots of live replicas, clamped.
local function retry_after(default_ms, max_s)
  local lengths, mean = redis.call('LRANGE', LENGTHS, 0, -1), default_ms
  if #lengths > 0 then
    local total = 0
    for _, x in ipairs(lengths) do total = total + tonumber(x) end
    mean = total / #lengths
  end
  local cap = 0
  for _, info in pairs(live_replicas()) do
    if not info.draining then cap = cap + info.n * info.cap end
  end
  if cap == 0 then cap = ME.n * ME.cap end
  return math.min(max_s, math.max(1, math.ceil(mean / 1000 / cap)))
end

local function reply(code, result)
  return {code, result, EVENTS, redis.call('ZCARD', QUEUE), TAKEN}
end
"""

"""The Lua scripts of shared admission. Each runs atomically in Redis, so no decision ever races another.

Calling convention (every script): no KEYS (every key is derived from the prefix, see the package docstring); the
first six ARGV are a header, the script's own arguments follow from ARGV[7]:

    ARGV[1] key prefix    ARGV[2] calling replica id (BY)    ARGV[3] TTL of finished tickets (ms)
    ARGV[4] event stream MAXLEN (approximate)    ARGV[5] the caller's replica info ("workers|slots|mask|draining|
    reserved|generation"; the generation grows with every change, so an older info never replaces a newer one)
    ARGV[6] how long a payload outlives admission (ms)

Every script returns `{code, result, events, queue_depth, taken}`: `code` is "ok" or a script-specific outcome,
`events` the ticket events it appended to the stream (the caller delivers them locally at once), `taken` the
`id, payload` pairs it admitted onto BY. Time is Redis `TIME` (ms): deadlines never depend on replicas' clocks.

Invariants every script keeps (tests read Redis to check them after each step):

- a ticket is in `queue` (and `qdl`, and `hbdl` when heartbeats are on) iff its state is `queued`;
- a ticket is in `held:<r>` with worker w iff its state is `admitted` on replica r, worker w;
- no worker of a replica holds more than its slots (only `pick` chooses a worker, and only for BY itself);
- `live` holds exactly the queued and admitted tickets; finished ones carry a TTL and no payload;
- `kq:<owner>` / `kr:<owner>` hold exactly the owner's queued / admitted tickets (the quota counts);
- usage is counted once per transition: a session at its create, its wait when it leaves the queue, its running
  time up to the mark `um` (moved by every count) at the owner's heartbeats and at its release, which happens once.
- the queue is strict FIFO: only its head is ever admitted, and expiry takes the earliest deadline first.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from service.usage.ledger import USAGE_BUCKET_S, USAGE_RETENTION_S

__all__ = ["SCRIPTS"]

_PRELUDE = r"""
local P, BY, TTL, MAXLEN, PAYLOAD_TTL = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local QUEUE, QDL, HBDL, LIVE = P .. 'queue', P .. 'qdl', P .. 'hbdl', P .. 'live'
local REPLICAS, STREAM, LENGTHS = P .. 'replicas', P .. 'events', P .. 'lengths'
local SEQ, EPOCH, WATCH, SEEN = P .. 'seq', P .. 'epoch', P .. 'watch', P .. 'seen'
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local EVENTS, TAKEN = {}, {}

local function tkey(id) return P .. 't:' .. id end
local function pkey(id) return P .. 'p:' .. id end
local function hkey(r) return P .. 'held:' .. r end
local function rkey(r) return P .. 'replica:' .. r end
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

-- Admit the queue head onto BY while BY is alive, not draining and has a free healthy slot.
local function admit_queued()
  if not ME or ME.draining or not alive(BY) then return end
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

-- Every slot replica r holds is reclaimed and its sessions marked failed; r leaves the registry. Their running
-- time counts up to r's last heartbeat (the last moment it was known alive; now when r leaves by itself).
local function reap(r)
  local seen = tonumber(redis.call('HGET', SEEN, r)) or NOW
  if r == BY then seen = NOW end
  for _, id in ipairs(redis.call('HKEYS', hkey(r))) do
    if redis.call('HGET', tkey(id), 'state') == 'admitted' then
      release_slot(id, r, 'replica_lost: ' .. r, nil, math.min(seen, NOW))
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

# create: ARGV[7] id, [8] owner, [9] create token (a retried create with the same token returns the same ticket),
# [10] queue_size, [11] queue timeout ms, [12] heartbeat timeout ms (0: off), [13] default session ms,
# [14] max Retry-After s, [15] "1" if a payload follows, [16] payload, [17] "1" if a registry body follows, [18] body
# (what GET on any replica answers from until the owner publishes its own), [19] the owner's max_running, [20] its
# max_queued (-1: no bound; see `admission.quota`).
# Codes: ok (the ticket: admitted at once or queued), rejected ({reason, retry_after_s, now_ms}), exists,
# unregistered (BY's liveness key lapsed: it must re-register first).
# The owner's quota is checked first, in this same atomic step (a refusal takes no place in the queue): refused
# with running_quota when its queued + admitted tickets reach max_running, with queued_quota when it would queue
# and max_queued of its tickets wait. Admitted at once only onto BY, only when nobody waits. It queues while the
# queue is shorter than queue_size plus the free healthy slots of live replicas (those will take the tickets ahead
# of it at once), else it is rejected.
_CREATE = r"""
expire_due()
if not alive(BY) then return reply('unregistered', {}) end
sync_info()
local id, owner, ctok = ARGV[7], ARGV[8], ARGV[9]
local key = tkey(id)
if redis.call('EXISTS', key) == 1 then
  if redis.call('HGET', key, 'ctok') == ctok then return reply('ok', snapshot(id)) end
  return reply('exists', {})
end
if ME.draining then return reply('rejected', {'draining', 0, NOW}) end
local depth, w = redis.call('ZCARD', QUEUE), nil
if depth == 0 then w = pick(BY, ME) end
local running, queued = redis.call('SCARD', krkey(owner)), redis.call('SCARD', kqkey(owner))
local max_running, max_queued = tonumber(ARGV[19]), tonumber(ARGV[20])
if max_running >= 0 and running + queued >= max_running then return reply('rejected', {'running_quota', 0, NOW}) end
if w == nil and max_queued >= 0 and queued >= max_queued then return reply('rejected', {'queued_quota', 0, NOW}) end
if w == nil then
  local free = 0
  for r, info in pairs(live_replicas()) do free = free + free_slots(r, info) end
  if depth >= tonumber(ARGV[10]) + free then
    return reply('rejected', {'queue_full', retry_after(tonumber(ARGV[13]), tonumber(ARGV[14])), NOW})
  end
end
local seq = redis.call('INCR', SEQ)
redis.call('HSET', key, 'id', id, 'owner', owner, 'origin', BY, 'ctok', ctok, 'seq', seq, 'created', NOW, 'v', 0)
if ARGV[17] == '1' then redis.call('HSET', key, 'body', ARGV[18]) end
redis.call('ZADD', LIVE, seq, id)
usage_add(owner, 's', 1, NOW)
if w ~= nil then
  redis.call('HSET', key, 'state', 'admitted', 'replica', BY, 'worker', w, 'admitted', NOW, 'status', 'admitted')
  redis.call('HSET', hkey(BY), id, w)
  redis.call('SADD', krkey(owner), id)
  emit('admitted', id)
else
  local qdl, hb = NOW + tonumber(ARGV[11]), tonumber(ARGV[12])
  redis.call('HSET', key, 'state', 'queued', 'qdl', qdl, 'status', 'queued')
  redis.call('ZADD', QUEUE, seq, id)
  redis.call('SADD', kqkey(owner), id)
  redis.call('ZADD', QDL, qdl, id)
  if hb > 0 then
    redis.call('HSET', key, 'hbdl', NOW + hb)
    redis.call('ZADD', HBDL, NOW + hb, id)
  end
  if ARGV[15] == '1' then redis.call('SET', pkey(id), ARGV[16], 'PX', tonumber(ARGV[11]) + PAYLOAD_TTL) end
  emit('queued', id)
  admit_queued()
end
return reply('ok', snapshot(id))
"""

# get: ARGV[7] id. Codes: ok (the ticket with its live position), unknown.
_GET = r"""
expire_due()
if redis.call('EXISTS', tkey(ARGV[7])) == 0 then return reply('unknown', {}) end
return reply('ok', snapshot(ARGV[7]))
"""

# heartbeat: ARGV[7] id, [8] heartbeat timeout ms (0: off), [9] owner ('': any). A queued ticket's heartbeat
# deadline moves to now + timeout (only if its owner is [9], when given); a no-op for any other state. The snapshot
# comes back whoever owns the ticket (the caller checks the owner: a GET on any replica is this one call, the record
# and its position read at one instant). Codes: ok, unknown.
_HEARTBEAT = r"""
expire_due()
local id = ARGV[7]
local f, hb = redis.call('HMGET', tkey(id), 'state', 'owner'), tonumber(ARGV[8])
local state = f[1]
if not state then return reply('unknown', {}) end
if state == 'queued' and hb > 0 and (ARGV[9] == '' or f[2] == ARGV[9]) then
  redis.call('HSET', tkey(id), 'hbdl', NOW + hb)
  redis.call('ZADD', HBDL, NOW + hb, id)
end
return reply('ok', snapshot(id))
"""

# cancel: ARGV[7] id. QUEUED -> CANCELLED (client_cancelled); finished: no-op. Codes: ok, unknown, illegal (admitted).
_CANCEL = r"""
expire_due()
local id = ARGV[7]
local state = redis.call('HGET', tkey(id), 'state')
if not state then return reply('unknown', {}) end
if state == 'admitted' then return reply('illegal', snapshot(id)) end
if state == 'queued' then leave_queue(id, 'cancelled', 'client_cancelled', NOW) end
return reply('ok', snapshot(id))
"""

# release: ARGV[7] id, [8] session-length window. QUEUED -> CANCELLED; ADMITTED on BY -> RELEASED, then the head is
# admitted onto BY's freed slot; finished: no-op. Codes: ok, unknown, elsewhere (admitted on another replica: only
# the owner, which closed the model session, may give its slot back).
_RELEASE = r"""
expire_due()
local id = ARGV[7]
local state = redis.call('HGET', tkey(id), 'state')
if not state then return reply('unknown', {}) end
if state == 'queued' then
  leave_queue(id, 'cancelled', 'client_cancelled', NOW)
elseif state == 'admitted' then
  if redis.call('HGET', tkey(id), 'replica') ~= BY then return reply('elsewhere', snapshot(id)) end
  release_slot(id, BY, nil, tonumber(ARGV[8]))
  admit_queued()
end
return reply('ok', snapshot(id))
"""

# request_close: ARGV[7] id, [8] mode. QUEUED -> CANCELLED; ADMITTED: a close request for the owner replica is
# appended to the stream (code requested); finished: no-op. Codes: ok, requested, unknown.
_REQUEST_CLOSE = r"""
expire_due()
local id = ARGV[7]
local state = redis.call('HGET', tkey(id), 'state')
if not state then return reply('unknown', {}) end
if state == 'queued' then
  leave_queue(id, 'cancelled', 'client_cancelled', NOW)
elseif state == 'admitted' then
  redis.call('XADD', STREAM, 'MAXLEN', '~', MAXLEN, '*', 'k', 'close', 'id', id,
    'replica', redis.call('HGET', tkey(id), 'replica'), 'mode', ARGV[8], 'by', BY)
  return reply('requested', snapshot(id))
end
return reply('ok', snapshot(id))
"""

# request_pause: ARGV[7] id, [8] "pause" or "resume". ADMITTED: the request is appended to the stream for the owner
# replica (code requested); QUEUED: nothing changes (code queued); finished: no-op. Codes: requested, queued, ok,
# unknown.
_REQUEST_PAUSE = r"""
expire_due()
local id = ARGV[7]
local state = redis.call('HGET', tkey(id), 'state')
if not state then return reply('unknown', {}) end
if state == 'queued' then return reply('queued', snapshot(id)) end
if state == 'admitted' then
  redis.call('XADD', STREAM, 'MAXLEN', '~', MAXLEN, '*', 'k', 'pause', 'id', id,
    'replica', redis.call('HGET', tkey(id), 'replica'), 'action', ARGV[8], 'by', BY)
  return reply('requested', snapshot(id))
end
return reply('ok', snapshot(id))
"""

# publish_status: ARGV[7] id, [8] session status, [9] status reason ("": none), [10] "1" if a body follows, [11]
# body. The registry part of a ticket, written only by its owner replica (also after release); a session the
# reaper marked lost keeps its failure. Codes: ok, unknown, elsewhere.
_PUBLISH_STATUS = r"""
local id = ARGV[7]
local key = tkey(id)
if redis.call('EXISTS', key) == 0 then return reply('unknown', {}) end
if redis.call('HGET', key, 'replica') ~= BY then return reply('elsewhere', snapshot(id)) end
if redis.call('HEXISTS', key, 'failure') == 1 then return reply('ok', snapshot(id)) end
redis.call('HSET', key, 'status', ARGV[8])
if ARGV[9] == '' then
  redis.call('HDEL', key, 'status_reason')
else
  redis.call('HSET', key, 'status_reason', ARGV[9])
end
if ARGV[10] == '1' then redis.call('HSET', key, 'body', ARGV[11]) end
emit('status', id)
return reply('ok', snapshot(id))
"""

# maintain: ARGV[7] replica TTL ms, [8] the epoch BY last saw ("" at first), [9] a fresh epoch token, then 6 per
# ticket BY believes it holds: id, worker, owner, created ms, admitted ms, version.
# Refreshes BY's liveness key and info, expires due tickets, reaps every replica whose liveness key is gone,
# re-asserts BY's slots (re-creating them if Redis lost its data), then admits the head onto BY while it has room.
# Result: {existed (BY's key had not lapsed), epoch, reaped replica ids, lost tickets (BY's sessions that were
# reaped or forgotten), unknown tickets (held by BY in Redis but not in BY's list), next deadline in ms or -1}.
_MAINTAIN = r"""
local existed = alive(BY)
redis.call('SET', rkey(BY), NOW, 'PX', ARGV[7])
redis.call('HSET', SEEN, BY, NOW)
sync_info()
local epoch = redis.call('GET', EPOCH)
if not epoch then
  epoch = ARGV[9]
  redis.call('SET', EPOCH, epoch)
end
local data_lost = ARGV[8] ~= '' and epoch ~= ARGV[8]
expire_due()
-- Reap only after a full TTL of continuous watching: after a gap in which nobody heartbeated (Redis down or
-- restarted, even with persistence) every replica first gets one TTL to refresh its key.
if not redis.call('SET', WATCH, NOW, 'NX', 'PX', ARGV[7]) then redis.call('PEXPIRE', WATCH, ARGV[7]) end
local dead = {}
if NOW - tonumber(redis.call('GET', WATCH)) >= tonumber(ARGV[7]) then
  for _, r in ipairs(redis.call('HKEYS', REPLICAS)) do
    if not alive(r) then
      reap(r)
      dead[#dead + 1] = r
    end
  end
end
local lost, unknown, mine, counts = {}, {}, {}, loads(BY, ME.n)
for i = 10, #ARGV, 6 do
  local id, w = ARGV[i], ARGV[i + 1]
  local key, wi = tkey(id), tonumber(ARGV[i + 1]) + 1
  mine[id] = true
  local state, gone = redis.call('HGET', key, 'state'), false
  if state == 'admitted' and redis.call('HGET', key, 'replica') == BY then
    redis.call('HSET', hkey(BY), id, w)
    usage_run(id, NOW)
  elseif not state and data_lost and counts[wi] ~= nil and counts[wi] < ME.cap then
    local seq = redis.call('INCR', SEQ)
    redis.call('HSET', key, 'id', id, 'owner', ARGV[i + 2], 'origin', BY, 'seq', seq, 'created', ARGV[i + 3],
      'state', 'admitted', 'replica', BY, 'worker', w, 'admitted', ARGV[i + 4], 'status', 'admitted', 'v', ARGV[i + 5],
      'um', NOW)
    redis.call('HSET', hkey(BY), id, w)
    redis.call('ZADD', LIVE, seq, id)
    redis.call('SADD', krkey(ARGV[i + 2]), id)
    counts[wi] = counts[wi] + 1
  elseif not state then
    gone = true
    lost[#lost + 1] = {'id', id, 'owner', ARGV[i + 2], 'state', 'released', 'reason', 'session_ended', 'replica', BY,
      'worker', w, 'created', ARGV[i + 3], 'admitted', ARGV[i + 4], 'ended', NOW, 'v', ARGV[i + 5],
      'failure', 'admission_record_lost', 'status', 'failed', 'status_reason', 'admission_record_lost'}
  elseif redis.call('HEXISTS', key, 'failure') == 1 then
    gone = true
    lost[#lost + 1] = snapshot(id)
  end
  -- A lost session still runs here until the service stops it: its slot stays reserved for this call's admissions.
  if gone and ME.reserved[wi] ~= nil then ME.reserved[wi] = ME.reserved[wi] + 1 end
end
local held = redis.call('HKEYS', hkey(BY))
for _, id in ipairs(held) do
  if not mine[id] then unknown[#unknown + 1] = snapshot(id) end
end
admit_queued()
return reply('ok', {existed and 1 or 0, epoch, dead, lost, unknown, next_deadline()})
"""

# drain: ARGV[5] carries BY's info with draining = 1. BY stops admitting; when no other live replica admits any
# more, every queued ticket is cancelled (reason draining) since nobody could admit it. Result: the cancelled.
_DRAIN = r"""
expire_due()
if alive(BY) then sync_info() end
for r, info in pairs(live_replicas()) do
  if r ~= BY and not info.draining then return reply('ok', {}) end
end
local cancelled = {}
for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, -1)) do
  leave_queue(id, 'cancelled', 'draining', NOW)
  cancelled[#cancelled + 1] = snapshot(id)
end
return reply('ok', cancelled)
"""

# deregister: BY leaves: any slot it still holds is reclaimed (the session is lost), its key and info are removed.
_DEREGISTER = r"""
expire_due()
reap(BY)
redis.call('DEL', rkey(BY))
return reply('ok', {})
"""

# list: ARGV[7] owner, [8] state, [9] worker, [10] replica ("" matches any). Result: live tickets in creation order.
_LIST = r"""
expire_due()
local out = {}
for _, id in ipairs(redis.call('ZRANGE', LIVE, 0, -1)) do
  local f = redis.call('HMGET', tkey(id), 'owner', 'state', 'worker', 'replica')
  if (ARGV[7] == '' or f[1] == ARGV[7]) and (ARGV[8] == '' or f[2] == ARGV[8])
      and (ARGV[9] == '' or f[3] == ARGV[9]) and (ARGV[10] == '' or f[4] == ARGV[10]) then
    out[#out + 1] = snapshot(id)
  end
end
return reply('ok', out)
"""

# positions: ARGV[7] n, then n ids to read whole, then ids whose position is enough. Read-only; O(log queue) per
# id (ZRANK), never the whole queue. Result: {snapshots (with positions) of the first n still queued, flat
# {id, position, ...} of the others still queued}.
_POSITIONS = r"""
local whole, ranks, last_whole = {}, {}, 7 + tonumber(ARGV[7])
for i = 8, #ARGV do
  local id = ARGV[i]
  local rank = redis.call('ZRANK', QUEUE, id)
  if rank and i <= last_whole then
    whole[#whole + 1] = snapshot(id)
  elseif rank then
    ranks[#ranks + 1] = id
    ranks[#ranks + 1] = rank + 1
  end
end
return reply('ok', {whole, ranks})
"""

# overview: read-only. Result: per registered replica {id, info, alive (1/0), worker index of every held slot}.
_OVERVIEW = r"""
local out, all = {}, redis.call('HGETALL', REPLICAS)
for i = 1, #all, 2 do
  out[#out + 1] = {all[i], all[i + 1], alive(all[i]) and 1 or 0, redis.call('HVALS', hkey(all[i]))}
end
return reply('ok', out)
"""

# usage_flush: then 3 per owner: owner, chunks, frames (what BY generated since its last flush). Counted now.
_USAGE_FLUSH = r"""
for i = 7, #ARGV, 3 do
  usage_add(ARGV[i], 'c', tonumber(ARGV[i + 1]), NOW)
  usage_add(ARGV[i], 'f', tonumber(ARGV[i + 2]), NOW)
end
return reply('ok', {})
"""

# usage_read: ARGV[7] owner, [8] since (ms). Read-only. Result: {first bucket start ms, now ms, r, q, s, c, f} summed
# over the owner's buckets from the one holding `since`.
_USAGE_READ = r"""
local owner, since = ARGV[7], tonumber(ARGV[8])
local first = since - since % UBUCKET
local sums = {r = 0, q = 0, s = 0, c = 0, f = 0}
for _, bucket in ipairs(redis.call('ZRANGEBYSCORE', P .. 'ub:' .. owner, first, '+inf')) do
  local flat = redis.call('HGETALL', P .. 'u:' .. owner .. ':' .. bucket)
  for i = 1, #flat, 2 do
    if sums[flat[i]] then sums[flat[i]] = sums[flat[i]] + tonumber(flat[i + 1]) end
  end
end
return reply('ok', {first, NOW, sums.r, sums.q, sums.s, sums.c, sums.f})
"""

# usage_totals: read-only. Result: per owner ever counted {owner, r, q, s, c, f} (all time).
_USAGE_TOTALS = r"""
local out = {}
for _, owner in ipairs(redis.call('SMEMBERS', P .. 'uowners')) do
  local f = redis.call('HMGET', P .. 'ut:' .. owner, 'r', 'q', 's', 'c', 'f')
  out[#out + 1] = {owner, tonumber(f[1]) or 0, tonumber(f[2]) or 0, tonumber(f[3]) or 0, tonumber(f[4]) or 0,
    tonumber(f[5]) or 0}
end
return reply('ok', out)
"""

_USAGE_CONSTANTS = f"local UBUCKET, URETAIN = {USAGE_BUCKET_S * 1000}, {USAGE_RETENTION_S * 1000}\n"

SCRIPTS: Mapping[str, str] = MappingProxyType(
    {
        name: _USAGE_CONSTANTS + _PRELUDE + body
        for name, body in {
            "create": _CREATE,
            "get": _GET,
            "heartbeat": _HEARTBEAT,
            "cancel": _CANCEL,
            "release": _RELEASE,
            "request_close": _REQUEST_CLOSE,
            "request_pause": _REQUEST_PAUSE,
            "publish_status": _PUBLISH_STATUS,
            "maintain": _MAINTAIN,
            "drain": _DRAIN,
            "deregister": _DEREGISTER,
            "list": _LIST,
            "positions": _POSITIONS,
            "overview": _OVERVIEW,
            "usage_flush": _USAGE_FLUSH,
            "usage_read": _USAGE_READ,
            "usage_totals": _USAGE_TOTALS,
        }.items()
    }
)
"""Script name -> full Lua source (the shared prelude, then the body)."""

"""The Lua bodies of the ticket scripts: what one caller asks of one ticket (create, read, heartbeat, cancel,
release, close and pause requests, the registry write) and the reads of the live tickets (list, positions).

Each body runs after the prelude (`service.scaleout.redis_side.prelude`); the comment above it states its arguments
(from ARGV[7], after the header), its codes and its result. `TICKET_SCRIPTS` maps a script's name to its body.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["TICKET_SCRIPTS"]

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
if depth == 0 and redis.call('ZCARD', ORPHANS) == 0 then w = pick(BY, ME) end
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
  -- kept a while: if the owner marks the session adoptable (issue #33), an adopter prepares it again from this
  if ARGV[15] == '1' then redis.call('SET', pkey(id), ARGV[16], 'PX', PAYLOAD_TTL) end
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
  if redis.call('HGET', tkey(id), 'replica') ~= BY or is_orphan(id) then return reply('elsewhere', snapshot(id)) end
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
elseif state == 'admitted' and is_orphan(id) then
  end_orphan(id, nil)  -- nobody runs it: it ends here
  admit_queued()
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
# body, [12] how long the session has been paused (ms; "" or absent: it is not paused). The registry part of a
# ticket, written only by its owner replica (also after release); a session the reaper marked lost keeps its failure.
# A paused session's pause start is kept on this clock as `paused` (written with each status while it is paused,
# deleted with the first that is not), so that the reaper orphans it paused if its owner is lost (`reap`); the last
# status Redis holds wins. Codes: ok, unknown, elsewhere.
_PUBLISH_STATUS = r"""
local id = ARGV[7]
local key = tkey(id)
if redis.call('EXISTS', key) == 0 then return reply('unknown', {}) end
if redis.call('HGET', key, 'replica') ~= BY or is_orphan(id) then return reply('elsewhere', snapshot(id)) end
if redis.call('HEXISTS', key, 'failure') == 1 then return reply('ok', snapshot(id)) end
redis.call('HSET', key, 'status', ARGV[8])
if ARGV[9] == '' then
  redis.call('HDEL', key, 'status_reason')
else
  redis.call('HSET', key, 'status_reason', ARGV[9])
end
if ARGV[10] == '1' then redis.call('HSET', key, 'body', ARGV[11]) end
local paused_ms = tonumber(ARGV[12] or '')
if paused_ms then
  redis.call('HSET', key, 'paused', NOW - math.max(0, math.floor(paused_ms)))
else
  redis.call('HDEL', key, 'paused')
end
emit('status', id)
return reply('ok', snapshot(id))
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

TICKET_SCRIPTS: Mapping[str, str] = MappingProxyType(
    {
        "create": _CREATE,
        "get": _GET,
        "heartbeat": _HEARTBEAT,
        "cancel": _CANCEL,
        "release": _RELEASE,
        "request_close": _REQUEST_CLOSE,
        "request_pause": _REQUEST_PAUSE,
        "publish_status": _PUBLISH_STATUS,
        "list": _LIST,
        "positions": _POSITIONS,
    }
)

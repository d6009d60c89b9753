"""The Lua bodies of adoption (issue #33; docs/continuity.md): a running session outlives its replica.

An owner marks each session it can be rebuilt elsewhere (`adoptable`, once its checkpoint is in Redis; the
create payload, the request an adopter prepares again, is then kept until the session ends). When the
owner's liveness lapses the reaper (`reap` in the prelude) does not fail a marked session whose checkpoint exists:
it leaves the owner's slot and waits in `orphans` (state still admitted, status `recovering`). A draining owner
puts its own sessions there (`hand_off`). Any replica with a free slot takes orphans, oldest first, ahead of the
queue (`adopt`): removing the id from `orphans` and moving the slot to the adopter is one script, so of racing
adopters exactly one wins and the others see it gone. An orphan whose checkpoint is gone, or that waited longer
than the adopter's bound, fails `replica_lost` as before; one whose client stops it meanwhile ends closed
(`request_close`).

Each body runs after the prelude; the comment above it states its arguments (from ARGV[7]) and its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ADOPTION_SCRIPTS"]

# adoptable: ARGV[7] id. BY's admitted session may be adopted if BY is lost: marked, and its create payload (the
# request an adopter prepares again) kept until the session ends. Codes: ok, no_payload, elsewhere, unknown.
_ADOPTABLE = r"""
local id = ARGV[7]
local f = redis.call('HMGET', tkey(id), 'state', 'replica')
if not f[1] then return reply('unknown', {}) end
if f[1] ~= 'admitted' or f[2] ~= BY or is_orphan(id) then return reply('elsewhere', {}) end
if redis.call('PERSIST', pkey(id)) == 0 and redis.call('EXISTS', pkey(id)) == 0 then return reply('no_payload', {}) end
redis.call('HSET', tkey(id), 'ad', '1')
return reply('ok', {})
"""

# hand_off: ARGV[7] id, ARGV[8] "check" or "go", [9] with "go": how long the session has been paused (ms; "" or
# absent: it is not paused). BY (draining) gives its admitted session up for adoption.
# "check" writes nothing: is there room for it elsewhere, a free healthy slot on a live replica that is not BY and
# not draining, beyond the orphans already waiting? (ok, or nowhere: BY keeps running it and drains it as before.)
# "go" orphans it now, after BY stopped generating it and wrote its last checkpoint; it does not look at room again
# (a slot taken since the check leaves the orphan waiting, ahead of the queue, up to the adopters' bound); a paused
# session keeps when its pause began (`paused`, this clock) for its adopter. Codes: ok, nowhere, no_checkpoint,
# elsewhere, unknown.
_HAND_OFF = r"""
local id, step = ARGV[7], ARGV[8]
local f = redis.call('HMGET', tkey(id), 'state', 'replica')
if not f[1] then return reply('unknown', {}) end
if f[1] ~= 'admitted' or f[2] ~= BY or is_orphan(id) then return reply('elsewhere', snapshot(id)) end
if redis.call('EXISTS', CKPT .. id) == 0 or redis.call('EXISTS', pkey(id)) == 0 then
  return reply('no_checkpoint', snapshot(id))
end
if step == 'check' then
  local room = -redis.call('ZCARD', ORPHANS)
  for r, info in pairs(live_replicas()) do
    if r ~= BY then room = room + free_slots(r, info) end
  end
  if room > 0 then return reply('ok', snapshot(id)) end
  return reply('nowhere', snapshot(id))
end
usage_run(id, NOW)
redis.call('HSET', tkey(id), 'ad', '1')
local paused_ms = tonumber(ARGV[9] or '')
orphan(id, BY, 'replica_draining', paused_ms and (NOW - math.max(0, math.floor(paused_ms))) or nil)
return reply('ok', snapshot(id))
"""

# adopt: ARGV[7] how long an orphan may wait for an adopter (ms), [8] the most to adopt in this call. First every
# orphan whose checkpoint is gone or whose wait is over fails (replica_lost); then BY (alive, not draining) adopts
# the oldest orphans while it has a free healthy slot: the slot moves to BY in this script, so exactly one replica
# adopts each. Result: {adopted tickets (BY rebuilds each; each keeps `why` and `orphaned`: why and when it lost its
# replica; and `paused`, when its pause began, if it was handed off paused), failed tickets}.
_ADOPT = r"""
local max_wait, most = tonumber(ARGV[7]), tonumber(ARGV[8])
local adopted, failed = {}, {}
for _, id in ipairs(redis.call('ZRANGE', ORPHANS, 0, -1)) do
  local f = redis.call('HMGET', tkey(id), 'orphaned', 'replica')
  local why = nil
  if redis.call('EXISTS', CKPT .. id) == 0 or redis.call('EXISTS', pkey(id)) == 0 then
    why = 'replica_lost: ' .. tostring(f[2]) .. ' (no checkpoint to rebuild the session from)'
  elseif NOW - (tonumber(f[1]) or NOW) > max_wait then
    why = 'replica_lost: ' .. tostring(f[2]) .. ' (no replica adopted the session in time)'
  end
  if why then
    end_orphan(id, why)
    failed[#failed + 1] = snapshot(id)
  end
end
if ME and not ME.draining and alive(BY) then
  while #adopted < most do
    local id = redis.call('ZRANGE', ORPHANS, 0, 0)[1]
    if not id then break end
    local w = pick(BY, ME)
    if w == nil then break end
    redis.call('ZREM', ORPHANS, id)
    -- `orphaned` and `why` stay: the adopter's recovery cause and start
    redis.call('HSET', tkey(id), 'replica', BY, 'worker', w, 'adopted', NOW, 'um', NOW)
    redis.call('HSET', hkey(BY), id, w)
    emit('adopted', id)
    adopted[#adopted + 1] = snapshot(id)
  end
end
admit_queued()
return reply('ok', {adopted, failed})
"""

ADOPTION_SCRIPTS: Mapping[str, str] = MappingProxyType(
    {"adoptable": _ADOPTABLE, "hand_off": _HAND_OFF, "adopt": _ADOPT}
)

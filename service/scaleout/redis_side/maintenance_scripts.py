"""The Lua bodies of the replica-level scripts: the maintenance pass (heartbeat, expiry, reaping, re-assertion,
admission onto free slots), drain and deregistration, the deployment overview, and the usage counts.

Each body runs after the prelude (`service.scaleout.redis_side.prelude`); the comment above it states its arguments
(from ARGV[7], after the header) and its result. `MAINTENANCE_SCRIPTS` maps a script's name to its body.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["MAINTENANCE_SCRIPTS"]

# maintain: ARGV[7] replica TTL ms, [8] the epoch BY last saw ("" at first), [9] a fresh epoch token, [10] BY's
# address for the other replicas ("" none), then 6 per ticket BY believes it holds: id, worker, owner, created ms,
# admitted ms, version.
# Refreshes BY's liveness key, its address (the same TTL: it exists exactly while BY is alive) and info, expires
# due tickets, reaps every replica whose liveness key is gone, re-asserts BY's slots (re-creating them if Redis
# lost its data), then admits the head onto BY while it has room.
# Result: {existed (BY's key had not lapsed), epoch, reaped replica ids, lost tickets (BY's sessions that were
# reaped or forgotten), unknown tickets (held by BY in Redis but not in BY's list), next deadline in ms or -1,
# reaped tickets (the sessions of the replicas this call reaped, each reported by this call only)}.
_MAINTAIN = r"""
local existed = alive(BY)
redis.call('SET', rkey(BY), NOW, 'PX', ARGV[7])
if ARGV[10] ~= '' then redis.call('SET', ukey(BY), ARGV[10], 'PX', ARGV[7]) else redis.call('DEL', ukey(BY)) end
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
for i = 11, #ARGV, 6 do
  local id, w = ARGV[i], ARGV[i + 1]
  local key, wi = tkey(id), tonumber(ARGV[i + 1]) + 1
  mine[id] = true
  local state, gone = redis.call('HGET', key, 'state'), false
  if state == 'admitted' and redis.call('HGET', key, 'replica') == BY and not is_orphan(id) then
    redis.call('HSET', hkey(BY), id, w)
    usage_run(id, NOW)
  elseif state == 'admitted' then
    -- reaped while BY was silent and waiting for an adopter, or adopted: it goes on elsewhere, BY's copy stops
    gone = true
    local flat = snapshot(id)
    flat[#flat + 1] = 'failure'
    flat[#flat + 1] = 'replica_lost: ' .. BY .. ' (the session went on elsewhere)'
    lost[#lost + 1] = flat
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
return reply('ok', {existed and 1 or 0, epoch, dead, lost, unknown, next_deadline(), REAPED})
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
redis.call('DEL', rkey(BY), ukey(BY))
return reply('ok', {})
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

MAINTENANCE_SCRIPTS: Mapping[str, str] = MappingProxyType(
    {
        "maintain": _MAINTAIN,
        "drain": _DRAIN,
        "deregister": _DEREGISTER,
        "overview": _OVERVIEW,
        "usage_flush": _USAGE_FLUSH,
        "usage_read": _USAGE_READ,
        "usage_totals": _USAGE_TOTALS,
    }
)

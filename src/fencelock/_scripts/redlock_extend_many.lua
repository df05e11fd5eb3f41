-- redlock_extend_many: one Redlock node's part of the watchdog's batch (see redlock_extend.lua for one lease).
--
-- KEYS[2i-1]   lock key of lease i     fencelock:{name}:lock
-- KEYS[2i]     hwm key of lease i      fencelock:{name}:fence
-- KEYS[#KEYS-2]  ttls key              fencelock:redlock:ttls (see redlock_acquire.lua)
-- KEYS[#KEYS-1]  marker key            fencelock:redlock:node
-- KEYS[#KEYS]    incarnation key       fencelock:redlock:incarnation
-- ARGV[3i-2]   token of lease i
-- ARGV[3i-1]   ttl of lease i, milliseconds from now
-- ARGV[3i]     t (the fence) of lease i
--
-- returns      an array: 1 where lease i was extended on this node, 0 where it is not this grant's any more;
--              -3 for every lease when the node does not count (see redlock_extend.lua)
local out = {}
local ttls = {}
local count = (#KEYS - 3) / 2
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not redis.call('GET', KEYS[#KEYS - 1]) or redis.call('HGET', KEYS[#KEYS], 'run') ~= run then
  for i = 1, count do
    out[i] = -3
  end
  return out
end
for i = 1, count do
  local lock, hwm = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('GET', lock) == ARGV[3 * i - 2] and tonumber(redis.call('GET', hwm) or '0') == tonumber(ARGV[3 * i]) then
    redis.call('PEXPIRE', lock, ARGV[3 * i - 1])
    ttls[ARGV[3 * i - 1]] = true
    out[i] = 1
  else
    out[i] = 0
  end
end
if next(ttls) then
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  for ttl in pairs(ttls) do
    redis.call('ZADD', KEYS[#KEYS - 2], 'GT', now + tonumber(ttl), ttl)
  end
end
return out

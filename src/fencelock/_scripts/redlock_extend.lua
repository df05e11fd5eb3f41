-- redlock_extend: reset one node's TTL only if the key is still this grant's (same token and proposal t).
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  hwm key       fencelock:{name}:fence
-- KEYS[3]  ttls key      fencelock:redlock:ttls  (see redlock_acquire.lua: the lease's TTL and its new expiry)
-- KEYS[4]  marker key    fencelock:redlock:node
-- KEYS[5]  incarnation   fencelock:redlock:incarnation (its 'run': the server process the data set belongs to)
-- ARGV[1]  token
-- ARGV[2]  ttl           milliseconds from now
-- ARGV[3]  t             the grant's proposal
--
-- returns  1             extended
--          0             not ours any more on this node
--          -3            the node does not count: it lost its data, or its server restarted (or a replica was
--                        promoted in its place) since it was marked, and the gate has not judged it yet; a key of
--                        ours there may be a copy from before the grants it lost, so it says neither yes nor no
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not redis.call('GET', KEYS[4]) or redis.call('HGET', KEYS[5], 'run') ~= run then
  return -3
end
if redis.call('GET', KEYS[1]) == ARGV[1] and tonumber(redis.call('GET', KEYS[2]) or '0') == tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  redis.call('ZADD', KEYS[3], 'GT', now + tonumber(ARGV[2]), ARGV[2])
  return 1
end
return 0

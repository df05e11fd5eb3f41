-- redlock_extend: reset one node's TTL only if the key is still this grant's (same token and proposal t).
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  hwm key       fencelock:{name}:fence
-- KEYS[3]  ttls key      fencelock:redlock:ttls  (see redlock_acquire.lua: the lease's TTL and its new expiry)
-- ARGV[1]  token
-- ARGV[2]  ttl           milliseconds from now
-- ARGV[3]  t             the grant's proposal
--
-- returns  1             extended
--          0             not ours any more on this node
if redis.call('GET', KEYS[1]) == ARGV[1] and tonumber(redis.call('GET', KEYS[2]) or '0') == tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  redis.call('ZADD', KEYS[3], 'GT', now + tonumber(ARGV[2]), ARGV[2])
  return 1
end
return 0

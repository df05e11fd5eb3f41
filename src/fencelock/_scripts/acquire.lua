-- acquire: take the lock if it is free, and hand out the next fence in the same step.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  fence key     fencelock:{name}:fence   (counter, no TTL)
-- KEYS[3]  waiters key   fencelock:{name}:waiters (marker: someone waits for a release)
-- ARGV[1]  token         random, >= 128 bits, unique to this acquisition
-- ARGV[2]  ttl           milliseconds
--
-- returns  {1, fence}    granted; fence is strictly greater than every fence granted before for this name
--          {0, pttl}     held by someone else; pttl = milliseconds until the holder's key expires by itself
--
-- Re-running with the same token (a retry after a lost reply) finds its own key and returns the same grant, its
-- TTL reset to ttl from now, so the client may retry an acquire whose outcome it does not know (and count the
-- lease's validity from the retry).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
local pttl = redis.call('PTTL', KEYS[1])
-- Tell the holder's release that someone is waiting; the marker lives exactly as long as the holder's key.
redis.call('SET', KEYS[3], '1', 'PX', math.max(pttl, 1))
return {0, pttl}

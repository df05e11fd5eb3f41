-- extend: reset the TTL only if the lock is still ours (compare-and-pexpire).
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- ARGV[1]  token         the holder's token
-- ARGV[2]  ttl           milliseconds from now
--
-- returns  1             extended
--          0             not ours any more (expired, or held by another token)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0

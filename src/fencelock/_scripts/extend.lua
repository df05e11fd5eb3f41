-- extend: reset the TTL only if the lock is still ours (compare-and-pexpire); the fence key outlives it.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  fence key     fencelock:{name}:fence
-- ARGV[1]  token         the holder's token
-- ARGV[2]  ttl           milliseconds from now
-- ARGV[3]  fence keep    milliseconds the fence key lives from now (the retention, never less than the ttl)
--
-- returns  1             extended
--          0             not ours any more (expired, or held by another token)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0

-- release: delete the lock only if it is still ours (compare-and-delete), and wake one waiter.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  fence key     fencelock:{name}:fence
-- KEYS[3]  waiters key   fencelock:{name}:waiters
-- KEYS[4]  wake key      fencelock:{name}:wake    (list that waiters BLPOP)
-- KEYS[5]  queue key     fencelock:{name}:queue   (fair waiters, oldest first)
-- ARGV[1]  token         the holder's token
-- ARGV[2]  fence         the holder's fence
--
-- returns  {1, head}     released: the key held our token and is gone; head = the fair queue's first token
--                        ('' if none), whose own wake list the client pushes to next
--          {0, ''}       the key is gone and no later grant exists (it expired; nobody else took the lock)
--          {-1, ''}      someone else holds the lock, or held it after us (the fence counter moved on)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local pttl = redis.call('PTTL', KEYS[3])
  if pttl > 0 then
    -- Someone waits. Leave exactly one wake-up, which lives as long as the waiters' marker would have:
    -- a waiter that has not started to block yet still finds it.
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], ARGV[2])
    redis.call('PEXPIRE', KEYS[4], pttl)
  end
  return {1, redis.call('LINDEX', KEYS[5], 0) or ''}
end
if redis.call('EXISTS', KEYS[1]) == 0 and tonumber(redis.call('GET', KEYS[2]) or '0') <= tonumber(ARGV[2]) then
  return {0, ''}
end
return {-1, ''}

-- release: delete the lock only if it is still ours (compare-and-delete), and wake the next waiter.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  fence key     fencelock:{name}:fence
-- KEYS[3]  waiters key   fencelock:{name}:waiters
-- KEYS[4]  wake key      fencelock:{name}:wake    (list that waiters BLPOP)
-- KEYS[5]  queue key     fencelock:{name}:queue   (fair waiters, oldest first)
-- KEYS[6]  wake prefix   fencelock:{name}:wake:   (a fair waiter BLPOPs its own list, this prefix + its token:
--                                                   the same hash tag, so the same slot as every key above)
-- ARGV[1]  token         the holder's token
-- ARGV[2]  fence         the holder's fence
-- ARGV[3]  entry ttl     milliseconds the fair head's wake-up lives (as long as its queue entry would)
--
-- returns  1             released: the key held our token and is gone
--          0             the key is gone and no later grant exists (it expired; nobody else took the lock)
--          -1            someone else holds the lock, or held it after us (the fence counter moved on)
--
-- Fences are compared as decimal strings (INCR's and the client's: no sign, no leading zeros), shorter first:
-- as doubles, 2^53 + 1 and 2^53 are one number, and a later grant above 2^53 would read as "nobody after us".
--
-- The wake-ups are pushed here, in the same step as the delete: the next waiter never depends on the releasing
-- process being scheduled again after the release (on a busy machine that can take tens of milliseconds).
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
  local head = redis.call('LINDEX', KEYS[5], 0)
  if head then
    -- Fair waiters: only the head may take the lock, so only the head is woken, on its own list.
    redis.call('RPUSH', KEYS[6] .. head, ARGV[2])
    redis.call('PEXPIRE', KEYS[6] .. head, ARGV[3])
  end
  return 1
end
local counter = redis.call('GET', KEYS[2]) or '0'
if redis.call('EXISTS', KEYS[1]) == 0 and (#counter < #ARGV[2] or (#counter == #ARGV[2] and counter <= ARGV[2])) then
  return 0
end
return -1

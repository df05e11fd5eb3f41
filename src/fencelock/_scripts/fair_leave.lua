-- fair_leave: a waiter that gives up (deadline, cancellation) leaves the queue at once, and wakes the new head
-- if the lock is free (else the holder's release wakes it).
--
-- KEYS[1]  lock key       fencelock:{name}:lock
-- KEYS[2]  queue key      fencelock:{name}:queue
-- KEYS[3]  deadlines key  fencelock:{name}:deadlines
-- KEYS[4]  wake prefix    fencelock:{name}:wake:   (the head BLPOPs this prefix + its token: the same slot)
-- ARGV[1]  token
-- ARGV[2]  entry ttl      milliseconds the head's wake-up lives
--
-- returns  1 if a new head was woken, else 0
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    redis.call('RPUSH', KEYS[4] .. head, 0)
    redis.call('PEXPIRE', KEYS[4] .. head, ARGV[2])
    return 1
  end
end
return 0

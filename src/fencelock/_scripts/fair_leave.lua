-- fair_leave: a waiter that gives up (deadline, cancellation) leaves the queue at once.
--
-- KEYS[1]  lock key       fencelock:{name}:lock
-- KEYS[2]  queue key      fencelock:{name}:queue
-- KEYS[3]  deadlines key  fencelock:{name}:deadlines
-- ARGV[1]  token
--
-- returns  the token now at the head of the queue if the lock is free (it must be woken), else ''
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.call('LINDEX', KEYS[2], 0) or ''
end
return ''

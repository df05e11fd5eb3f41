-- fair_acquire: take the lock in arrival order. Waiters queue; only the head of the queue may take a free lock.
-- Non-fair acquires (acquire.lua) share the lock key, so mixing the two keeps mutual exclusion; they may jump
-- the queue, never break it.
--
-- KEYS[1]  lock key       fencelock:{name}:lock
-- KEYS[2]  fence key      fencelock:{name}:fence
-- KEYS[3]  queue key      fencelock:{name}:queue      (list of waiting tokens, oldest first)
-- KEYS[4]  deadlines key  fencelock:{name}:deadlines  (zset: token -> server ms when its entry expires)
-- ARGV[1]  token
-- ARGV[2]  ttl            milliseconds
-- ARGV[3]  entry ttl      milliseconds a queue entry lives unless this waiter tries again
-- ARGV[4]  fence keep     milliseconds the fence key lives from now: the retention, never less than the ttl
--
-- returns  {1, fence}          granted; fence = max(stored + 1, server clock in µs), as in acquire.lua (a number
--                              below 2^53 or the counter's decimal string)
--                              (again to the same token: a retry; its TTL is reset to ttl)
--          {0, pttl, place}    queued: pttl = ms until the holder's key expires (-1: free, but not our turn),
--                              place = 0 for the head of the queue
if redis.replicate_commands then redis.replicate_commands() end -- Redis 6: TIME before writes
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- Waiters that died or gave up without leaving: their entries expired. They block nobody.
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('LREM', KEYS[3], 0, dead)
  redis.call('ZREM', KEYS[4], dead)
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  -- A retry finds its own grant (the first reply was lost). Its TTL starts again now, as a first grant's would:
  -- the client counts the lease's validity from this request, sent after the first.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4]) -- the fence key outlives the lease
  return {1, redis.call('GET', KEYS[2])} -- a string: as a double, a fence above 2^53 loses digits
end
local head = redis.call('LINDEX', KEYS[3], 0)
if not holder and (not head or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  -- the fence step (same in acquire.lua): stored + 1, or the clock floor when that is higher
  local floor = tonumber(clock[1]) * 1000000 + tonumber(clock[2]) -- < 2^53: exact
  local fence
  if floor > tonumber(redis.call('GET', KEYS[2]) or '0') then
    fence = floor
    redis.call('SET', KEYS[2], string.format('%.0f', floor), 'PX', ARGV[4]) -- an integer's every digit
  else
    redis.call('INCR', KEYS[2]) -- exact 64-bit arithmetic on the server; its reply, a Lua double, is not:
    fence = redis.call('GET', KEYS[2]) -- every digit, as a string (2^53 + 1 would come back as 2^53 + 2)
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
  end
  return {1, fence}
end
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  redis.call('RPUSH', KEYS[3], ARGV[1])
end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), ARGV[1])
local pttl = -1
if holder then
  pttl = redis.call('PTTL', KEYS[1])
end
return {0, pttl, redis.call('LPOS', KEYS[3], ARGV[1])}

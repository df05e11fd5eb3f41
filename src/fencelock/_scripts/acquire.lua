-- acquire: take the lock if it is free, and hand out the next fence in the same step.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  fence key     fencelock:{name}:fence   (counter; lives ARGV[3] ms from each grant or extension)
-- KEYS[3]  waiters key   fencelock:{name}:waiters (marker: someone waits for a release)
-- ARGV[1]  token         random, >= 128 bits, unique to this acquisition
-- ARGV[2]  ttl           milliseconds
-- ARGV[3]  fence keep    milliseconds the fence key lives from now: the retention, never less than the ttl
--
-- returns  {1, fence}    granted; fence = max(stored + 1, server clock in µs) (`fencelock._logic.fences`), a
--                        number below 2^53 or the counter's decimal string (a double loses digits above): above
--                        every fence granted before, and above those a lost counter had granted, as long as
--                        this server's clock is ahead of the last one (docs/design/fences.md)
--          {0, pttl}     held by someone else; pttl = milliseconds until the holder's key expires by itself
--
-- Re-running with the same token (a retry after a lost reply) finds its own key and returns the same grant, its
-- TTL reset to ttl from now, so the client may retry an acquire whose outcome it does not know (and count the
-- lease's validity from the retry).
if redis.replicate_commands then redis.replicate_commands() end -- Redis 6: TIME after a write
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- the fence step (same in fair_acquire.lua): stored + 1, or the clock floor when that is higher
  local clock = redis.call('TIME')
  local floor = tonumber(clock[1]) * 1000000 + tonumber(clock[2]) -- < 2^53: exact
  local fence
  if floor > tonumber(redis.call('GET', KEYS[2]) or '0') then
    fence = floor
    redis.call('SET', KEYS[2], string.format('%.0f', floor), 'PX', ARGV[3]) -- an integer's every digit
  else
    redis.call('INCR', KEYS[2]) -- exact 64-bit arithmetic on the server; its reply, a Lua double, is not:
    fence = redis.call('GET', KEYS[2]) -- every digit, as a string (2^53 + 1 would come back as 2^53 + 2)
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3]) -- the fence key outlives the lease
  return {1, redis.call('GET', KEYS[2])} -- a string: as a double, a fence above 2^53 loses digits
end
local pttl = redis.call('PTTL', KEYS[1])
-- Tell the holder's release that someone is waiting; the marker lives exactly as long as the holder's key.
redis.call('SET', KEYS[3], '1', 'PX', math.max(pttl, 1))
return {0, pttl}

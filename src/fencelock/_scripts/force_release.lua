-- force_release: remove a lock whoever holds it (operators only: fencelock release --force), and wake a waiter
-- as a release would. The fence counter stays: the next grant still gets a higher fence.
--
-- KEYS[1]  lock key       fencelock:{name}:lock
-- KEYS[2]  fence key      fencelock:{name}:fence
-- KEYS[3]  waiters key    fencelock:{name}:waiters
-- KEYS[4]  wake key       fencelock:{name}:wake       (list that waiters BLPOP)
-- KEYS[5]  queue key      fencelock:{name}:queue      (fair waiters, oldest first)
-- KEYS[6]  deadlines key  fencelock:{name}:deadlines
-- KEYS[7]  wake prefix    fencelock:{name}:wake:      (a fair waiter BLPOPs this prefix + its token; the same hash
--                                                      tag. Redlock, which has no fair queue, leaves it out)
-- ARGV[1]  entry ttl      milliseconds the fair head's wake-up lives (as release.lua's ARGV[3])
-- ARGV[2]  'redlock'      (Redlock only) KEYS[7] is then the marker key fencelock:redlock:node and KEYS[8] the
--                         incarnation fencelock:redlock:incarnation (see redlock_acquire.lua)
--
-- returns  {pttl, fence, queued, holder}: what was removed, as status.lua reports it (pttl -2: nothing was held);
--          pttl -3 (Redlock): the node does not count (it lost its data, or its server restarted since it was
--          marked), so what it held says nothing; its key is removed all the same
--
-- Like release.lua, the wake-ups are pushed here, in the same step as the delete: the fair queue's head is woken
-- on its own list, so it never waits for its block to time out.
if redis.replicate_commands then redis.replicate_commands() end -- Redis 6: TIME before writes
local redlock = ARGV[2] == 'redlock'
local uncounted = false
if redlock then
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  uncounted = not redis.call('GET', KEYS[7]) or redis.call('HGET', KEYS[8], 'run') ~= run
end
local pttl = redis.call('PTTL', KEYS[1])
-- The counter as its decimal string: a Lua double would lose the digits of a fence above 2^53.
local fence = redis.call('GET', KEYS[2]) or '-1'
local digits = string.match(fence, '^%-?(%d+)$')
if not digits or #digits > 19 then
  return redis.error_reply('ERR the fence key ' .. KEYS[2] .. ' holds no fence (a 64-bit integer): '
    .. 'something other than fencelock wrote it')
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local queued = redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')
local holder = ''
if pttl ~= -2 then
  holder = redis.sha1hex(redis.call('GET', KEYS[1]))
  local pushed = fence
  if string.sub(fence, 1, 1) == '-' then
    pushed = '0'
  end
  redis.call('DEL', KEYS[1])
  local waiting = redis.call('PTTL', KEYS[3])
  if waiting > 0 then
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], pushed)
    redis.call('PEXPIRE', KEYS[4], waiting)
  end
  local head = redis.call('LINDEX', KEYS[5], 0)
  if head and KEYS[7] and not redlock then
    redis.call('RPUSH', KEYS[7] .. head, pushed)
    redis.call('PEXPIRE', KEYS[7] .. head, ARGV[1])
  end
end
if uncounted then
  return {-3, fence, queued, ''}
end
return {pttl, fence, queued, holder}

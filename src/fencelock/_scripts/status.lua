-- status: one lock as this server sees it now, read behind every holder's back (fencelock status / list).
-- Read-only. Works on a single Redis, a Cluster shard and one Redlock node (which has no fair queue).
--
-- KEYS[1]  lock key       fencelock:{name}:lock
-- KEYS[2]  fence key      fencelock:{name}:fence      (the fence counter; on Redlock the node's hwm)
-- KEYS[3]  deadlines key  fencelock:{name}:deadlines  (fair mode: queue entry -> server ms when it expires)
-- KEYS[4]  marker key     fencelock:redlock:node         (Redlock only, with KEYS[5]: see redlock_acquire.lua)
-- KEYS[5]  incarnation    fencelock:redlock:incarnation  (its 'run': the server process the data set belongs to)
--
-- returns  {pttl, fence, queued, holder}
--          pttl    ms left on the holder's key; -2 free; -1 a key without a TTL (never made by fencelock)
--          fence   the counter's value, a decimal string ('-1' if the name was never locked here); an error
--                  reply when the fence key holds no integer
--          queued  fair queue entries that have not expired (0 where nobody queues)
--          holder  SHA-1 of the holder's token ('' when free): Redlock compares grants across nodes by it;
--                  the token itself never leaves the server
--          {-3, -1, 0, ''}  (Redlock) the node does not count: it lost its data, or its server restarted since it
--                  was marked; what it holds says nothing (it may have lost a holder's key)
if KEYS[5] then
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if not redis.call('GET', KEYS[4]) or redis.call('HGET', KEYS[5], 'run') ~= run then
    return {-3, -1, 0, ''}
  end
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
local queued = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
local holder = ''
if pttl ~= -2 then
  holder = redis.sha1hex(redis.call('GET', KEYS[1]))
end
return {pttl, fence, queued, holder}

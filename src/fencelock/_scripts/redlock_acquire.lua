-- redlock_acquire: one Redlock node's acceptor. Grant proposal t only if the key is free and t is above the
-- node's high-water mark; see fencelock/_redis/redlock_node.py (NodeModel is the specification of this script).
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  hwm key       fencelock:{name}:fence   (the highest proposal this node granted, no TTL)
-- KEYS[3]  marker key    fencelock:redlock:node   (absent: the node lost its data and is not repaired;
--                        'floor:<digits>': every hwm here counts as at least that, see redlock_mark.lua)
-- KEYS[4]  waiters key   fencelock:{name}:waiters (marker: someone waits for a release)
-- KEYS[5]  incarnation   fencelock:redlock:incarnation (its 'run': the server process the data set belongs to)
-- KEYS[6]  ttls key      fencelock:redlock:ttls   (zset: a lease TTL in ms -> when the last lease with it granted
--                        or extended here expires, server ms; a repair's quarantine lasts the longest live one)
-- ARGV[1]  token         the acquisition's token
-- ARGV[2]  ttl           milliseconds
-- ARGV[3]  t             the proposal, an integer >= 1
--
-- returns  {1, t, 0, 0, run}           granted (also to this token's own earlier round: its key moves up to t)
--          {0, hwm, pttl, floor, run}  refused: the key is held, pttl = its milliseconds left
--          {0, hwm, -1, floor, run}    refused: the key is free but t <= hwm (propose again above hwm)
--          {-1, 0, 0, 0, run}          the node is not ready: it lost its data and is not repaired, or the
--                                      server restarted since it was marked (the gate decides whether it kept
--                                      its data)
--          run: the server process (INFO run_id), so that two listed names of one server are never counted twice
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local marker = redis.call('GET', KEYS[3])
if not marker or redis.call('HGET', KEYS[5], 'run') ~= run then
  return {-1, 0, 0, 0, run}
end
local hwm = tonumber(redis.call('GET', KEYS[2]) or '0')
local floor = tonumber(string.match(marker, '^floor:(%d+)$') or '0')
if floor > hwm then
  hwm = floor -- doubles: exact for integers below 2^53 (a clock in microseconds is below 2^51)
end
local t = tonumber(ARGV[3])
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    pttl = 2147483647 -- a key without a TTL is not ours to judge: treat it as held for long
  else
    redis.call('SET', KEYS[4], '1', 'PX', math.max(pttl, 1)) -- the holder's release will wake one waiter
  end
  return {0, hwm, pttl, floor, run}
end
-- Free, or held by this same acquisition (an earlier round, or a retry of this one): grant t if it is above
-- the hwm; the same t again only to the token that holds it.
if t < hwm or (t == hwm and not holder) then
  return {0, hwm, -1, floor, run}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
redis.call('ZADD', KEYS[6], 'GT', now + tonumber(ARGV[2]), ARGV[2])
return {1, t, 0, 0, run}

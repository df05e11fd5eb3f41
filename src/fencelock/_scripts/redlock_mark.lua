-- redlock_mark: raise a node's hwm and give it its marker, only on the data set the caller looked at.
-- (See fencelock/_logic/redlock.py, NodeModel.mark: the specification of this script.)
--
-- KEYS[1]    marker key       fencelock:redlock:node
-- KEYS[2]    incarnation key  fencelock:redlock:incarnation
-- KEYS[2+i]  hwm keys         fencelock:{name}:fence, to raise to ARGV[5+i] (never lowered)
-- ARGV[1]    nonce            the incarnation the caller's look saw (a node that lost its data has another)
-- ARGV[2]    mode             'raise'   raise the hwm keys only (a batch of a long repair)
--                             'repair'  raise, then mark: only once the quarantine is over
--                             'fresh'   mark a new node of a new deployment (every node answered 'fresh')
--                             'plain'   mark at once, whatever its state (connect(repair=False))
-- ARGV[3]    floor            decimal digits: every hwm on this node counts as at least this
-- ARGV[4]    clock            '1': the floor is at least this server's clock, in microseconds since 1970
--
-- returns    1 done, 0 already marked (nothing changed), -1 another data set (or not a new one), -2 quarantined
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local mode = ARGV[2]
if mode ~= 'plain' then
  if redis.call('HGET', KEYS[2], 'nonce') ~= ARGV[1] then
    return -1
  end
  if mode == 'fresh' and redis.call('HGET', KEYS[2], 'fresh') ~= '1' then
    return -1
  end
end
local clock = redis.call('TIME')
if mode == 'repair' then
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  if now < tonumber(redis.call('HGET', KEYS[2], 'until') or '0') then
    return -2
  end
end
for i = 3, #KEYS do
  local value = ARGV[i + 2]
  if tonumber(value) > tonumber(redis.call('GET', KEYS[i]) or '0') then
    redis.call('SET', KEYS[i], value)
  end
end
if mode == 'raise' then
  return 1
end
-- Kept as digits throughout: a Lua number is a double, exact below 2^53, but tostring() would print 1.8e+15.
local floor = ARGV[3]
if ARGV[4] == '1' then
  local micros = clock[1] .. string.format('%06d', tonumber(clock[2]))
  if tonumber(micros) > tonumber(floor) then
    floor = micros
  end
end
redis.call('SET', KEYS[1], 'floor:' .. floor)
return 1

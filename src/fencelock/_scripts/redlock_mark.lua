-- redlock_mark: raise a node's hwm and give it its marker, only on the data set the caller looked at.
-- (See fencelock/_redis/redlock_node.py, NodeModel.mark: the specification of this script.)
--
-- KEYS[1]    marker key       fencelock:redlock:node
-- KEYS[2]    incarnation key  fencelock:redlock:incarnation
-- KEYS[2+i]  hwm keys         fencelock:{name}:fence, to raise to ARGV[4+i] (never lowered)
-- ARGV[1]    nonce            the incarnation the caller's look saw (a node that lost its data has another)
-- ARGV[2]    mode             'raise'   raise the hwm keys only (a batch of a long repair)
--                             'repair'  raise, then mark: only once the quarantine is over
--                             'claim'   claim a new node for the new deployment ARGV[3] (the digest of the
--                                       nonces one look saw on every node): first claim wins, once per data set
--                             'fresh'   mark a new node claimed for deployment ARGV[3] (every claim succeeded),
--                                       with the deployment's floor ARGV[4]
--                             'plain'   mark at once, whatever its state (connect(repair=False))
-- ARGV[3]    floor            decimal digits: every hwm on this node counts as at least this (claim, fresh:
--                             the deployment's digest)
-- ARGV[4]    clock            '1': the floor is at least this server's clock, in microseconds since 1970 (fresh:
--                             the new deployment's floor, decimal digits: the same on every node)
--
-- Every mode but 'plain' acts only on a data set of this server process (its incarnation's run): one that a
-- restart may have rolled back is the gate's to judge first.
--
-- returns    1 done, 0 already marked (nothing changed), -1 another data set (or not a new one, or claimed for
--            another deployment, or another server process's), -2 quarantined
local mode = ARGV[2]
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local current = redis.call('HGET', KEYS[2], 'run') == run
local clock = redis.call('TIME')
-- Kept as digits throughout: a Lua number is a double, exact below 2^53, but tostring() would print 1.8e+15.
local micros = clock[1] .. string.format('%06d', tonumber(clock[2]))
if mode == 'claim' then
  if redis.call('HGET', KEYS[2], 'nonce') ~= ARGV[1] or not current then
    return -1
  end
  local claim = redis.call('HGET', KEYS[2], 'claim')
  if claim then
    return claim == ARGV[3] and 1 or -1
  end
  if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HGET', KEYS[2], 'fresh') ~= '1' then
    return -1
  end
  redis.call('HSET', KEYS[2], 'claim', ARGV[3])
  return 1
end
if mode ~= 'plain' and not current then
  return -1
end
if redis.call('EXISTS', KEYS[1]) == 1 and current then
  return 0
end
if mode ~= 'plain' and redis.call('HGET', KEYS[2], 'nonce') ~= ARGV[1] then
  return -1
end
if mode == 'fresh' then
  if redis.call('HGET', KEYS[2], 'claim') ~= ARGV[3] then
    return -1
  end
  redis.call('SET', KEYS[1], 'floor:' .. (string.match(ARGV[4], '^%d+$') or '0'))
  return 1
end
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
local floor = ARGV[3]
if ARGV[4] == '1' and tonumber(micros) > tonumber(floor) then
  floor = micros
end
redis.call('SET', KEYS[1], 'floor:' .. floor)
if not current then -- (plain: another process's data set, now this one's; its durability is asked at a look)
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
  redis.call('HSET', KEYS[2], 'run', run, 'replid', replid)
  redis.call('HDEL', KEYS[2], 'durable')
end
return 1

-- redlock_gate: what a Redlock node without its marker needs (see fencelock/_logic/redlock.py, Gate).
--
-- KEYS[1]  marker key      fencelock:redlock:node        (present: the node counts)
-- KEYS[2]  seen key        fencelock:redlock:seen        (present: a client has looked at this data set)
-- KEYS[3]  quarantine key  fencelock:redlock:quarantine  (present: the repair delay is not over)
-- ARGV[1]  delay           milliseconds a node that lost its data stays out before its repair
--
-- returns  'ready'         the marker is there
--          'fresh'         nobody saw this data set before (a new node, or one that lost everything);
--                          the quarantine starts now, in case it is the second
--          'quarantined'   it lost its data and waits out the delay
--          'repairable'    the delay is over: copy the hwm of a quorum of the others into it, then mark it
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 'ready'
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], '1')
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
  return 'fresh'
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 'quarantined'
end
return 'repairable'

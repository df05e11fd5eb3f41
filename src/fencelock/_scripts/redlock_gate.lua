-- redlock_gate: where a Redlock node's data set stands (see fencelock/_redis/redlock_node.py, NodeModel.gate).
--
-- KEYS[1]  marker key       fencelock:redlock:node         (present: the node counts; 'floor:<digits>' or any)
-- KEYS[2]  incarnation key  fencelock:redlock:incarnation  (hash: nonce, born, until, fresh; server ms)
-- KEYS[3]  legacy key       fencelock:redlock:seen         (left by an older fencelock: not a new data set)
-- ARGV[1]  delay            milliseconds a data set stays out after it is first seen (the quarantine)
-- ARGV[2]  window           milliseconds a new data set answers 'fresh' after it is first seen
-- ARGV[3]  nonce            this data set's incarnation, if this is the first look at it
-- ARGV[4]  peek             '1': look only, write nothing (operators' `fencelock nodes`)
--
-- returns  {state, nonce, ms until the quarantine ends, floor}; state is
--          'ready'        the marker is there (floor: what the marker raises every hwm to)
--          'fresh'        first seen less than `window` ago, never used: a new node (all fresh: a new deployment)
--          'quarantined'  unmarked, waiting out the delay
--          'repairable'   unmarked, the delay is over: repair it from the others (or from its clock), then mark it
local marker = redis.call('GET', KEYS[1])
local nonce = redis.call('HGET', KEYS[2], 'nonce')
if marker then
  return {'ready', nonce or '', 0, string.match(marker, '^floor:(%d+)$') or '0'}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local delay, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local born, till, fresh
if nonce then
  born = tonumber(redis.call('HGET', KEYS[2], 'born') or '0')
  till = tonumber(redis.call('HGET', KEYS[2], 'until') or '0')
  fresh = redis.call('HGET', KEYS[2], 'fresh') == '1'
else
  born, till, fresh = now, now + delay, redis.call('EXISTS', KEYS[3]) == 0
  if ARGV[4] ~= '1' then
    nonce = ARGV[3]
    redis.call('HSET', KEYS[2], 'nonce', nonce, 'born', string.format('%.0f', born),
               'until', string.format('%.0f', till), 'fresh', fresh and '1' or '0')
  end
end
if fresh and now < born + window then
  return {'fresh', nonce or '', till - now, '0'}
end
if now < till then
  return {'quarantined', nonce or '', till - now, '0'}
end
return {'repairable', nonce or '', 0, '0'}

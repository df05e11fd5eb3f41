-- redlock_gate: where a Redlock node's data set stands (see fencelock/_redis/redlock_node.py, NodeModel.gate).
--
-- KEYS[1]  marker key       fencelock:redlock:node         (present: the node counts; 'floor:<digits>' or any)
-- KEYS[2]  incarnation key  fencelock:redlock:incarnation  (hash: nonce, born, until, fresh, claim, run, durable,
--                           replid; server ms)
-- KEYS[3]  legacy key       fencelock:redlock:seen         (left by an older fencelock: not a new data set)
-- ARGV[1]  delay            milliseconds a data set stays out after it is first seen (the quarantine); a longer
--                           delay than the one kept raises it: the longest any client asked for is kept
-- ARGV[2]  window           milliseconds a new data set answers 'fresh' after it is first seen
-- ARGV[3]  nonce            this data set's incarnation, if this is the first look at it
-- ARGV[4]  peek             '1': look only, write nothing (operators' `fencelock nodes`, a repair's reads)
-- ARGV[5]  durable run      this server process's run_id if the client read `appendonly yes` and `appendfsync
--                           always` from it; '' if not; '?' if it has not asked (see 'restarted'): recorded as
--                           the data set's writer's durability when this process takes it, or when not known
--
-- A data set belongs to the server process (INFO run_id) that last looked at or marked it: its writer. The
-- incarnation records whether that writer was durable ('durable': '1' if the client read AOF with fsync always
-- from that very process, '0' if not; absent: not asked yet) and its replication id ('replid'). Found under
-- another process, the server restarted, or a replica was promoted in its place. The data set is taken over as
-- it is only if its writer was durable, the new process is too, and the new one is not a promoted replica of
-- the writer (its master_replid2 is the writer's replid: replication is asynchronous, it may lack the last
-- grants). Any other may have come back from a snapshot, or a replica's copy, without the writes after it, so
-- whatever its marker says it is a data set that lost data: unmarked, a new incarnation, not new, quarantined
-- from now. A look that writes asks first (returns 'restarted') whenever the writer's durability is not known.
--
-- returns  {state, nonce, ms until the quarantine ends (-1: none started yet, peek only), floor}; state is
--          'ready'        the marker is there (floor: what the marker raises every hwm to)
--          'fresh'        first seen less than `window` ago, never used: a new node (all fresh: a new deployment);
--                         floor: the first look's time in µs (+1 ms): a new deployment's floor is the highest
--          'quarantined'  unmarked, waiting out the delay
--          'repairable'   unmarked, the delay is over: repair it from the others (or from its clock), then mark it
--          'restarted'    (durable run '?') the server restarted since, or (a look that writes) the writer's
--                         durability is not known yet: look again, saying whether this process is durable
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local replication = redis.call('INFO', 'replication')
local replid = string.match(replication, 'master_replid:(%x+)') or ''
local replid2 = string.match(replication, 'master_replid2:(%x+)') or ''
local peek = ARGV[4] == '1'
local durable = ARGV[5] == run and '1' or '0'
local marker = redis.call('GET', KEYS[1])
local inc = redis.call('HMGET', KEYS[2], 'nonce', 'born', 'until', 'fresh', 'run', 'durable', 'replid')
local nonce = inc[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local delay, window = tonumber(ARGV[1]), tonumber(ARGV[2])
if (marker or nonce) and inc[5] ~= run then
  if ARGV[5] == '?' then
    return {'restarted', nonce or '', 0, '0'}
  end
  if durable == '1' and inc[6] == '1' and (not inc[7] or inc[7] ~= replid2) then
    if not peek then
      redis.call('HSET', KEYS[2], 'run', run, 'durable', '1', 'replid', replid)
    end
  else
    if peek then
      return {'quarantined', '', -1, '0'}
    end
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('HSET', KEYS[2], 'nonce', ARGV[3], 'born', string.format('%.0f', now),
               'until', string.format('%.0f', now + delay), 'fresh', '0', 'run', run, 'durable', durable,
               'replid', replid)
    return {'quarantined', ARGV[3], delay, '0'}
  end
elseif not peek and not inc[6] then
  if ARGV[5] == '?' then
    return {'restarted', nonce or '', 0, '0'}
  end
  if nonce then
    redis.call('HSET', KEYS[2], 'durable', durable, 'replid', replid)
  end
end
if marker then
  return {'ready', nonce or '', 0, string.match(marker, '^floor:(%d+)$') or '0'}
end
local born, till, fresh
if nonce then
  born = tonumber(inc[2] or '0')
  till = tonumber(inc[3] or '0')
  fresh = inc[4] == '1'
  if born + delay > till and not peek then
    till = born + delay
    redis.call('HSET', KEYS[2], 'until', string.format('%.0f', till))
  end
  if now < born then
    -- The node's clock was set back behind the first look: how long was waited since is unknown. The whole
    -- quarantine again from now: never shorter than what was left, never longer (a clock set back by a day must
    -- not keep the node out for a day).
    till, born = now + (till - born), now
    if not peek then
      redis.call('HSET', KEYS[2], 'born', string.format('%.0f', born), 'until', string.format('%.0f', till))
    end
  end
else
  fresh = redis.call('EXISTS', KEYS[3]) == 0
  if peek then
    return {fresh and 'fresh' or 'quarantined', '', -1, '0'}
  end
  born, till, nonce = now, now + delay, ARGV[3]
  redis.call('HSET', KEYS[2], 'nonce', nonce, 'born', string.format('%.0f', born),
             'until', string.format('%.0f', till), 'fresh', fresh and '1' or '0', 'run', run,
             'durable', durable, 'replid', replid)
end
if fresh and now < born + window then
  return {'fresh', nonce, math.max(till - now, 0), string.format('%.0f', (born + 1) * 1000)}
end
if now < till then
  return {'quarantined', nonce, till - now, '0'}
end
return {'repairable', nonce, 0, '0'}

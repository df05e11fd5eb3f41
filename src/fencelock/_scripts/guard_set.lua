-- guard_set: the Redis fencing guard. Write a value only if its fence is not older than one already accepted.
-- The rule is `fencelock._logic.fencing.accepts`: accept when fence >= highest accepted, else reject.
--
-- KEYS[1]  guard key     fencelock:{name}:guard   (highest fence accepted for this name, no TTL)
-- KEYS[2]  data key      the key to write (on Redis Cluster it must share the guard key's hash tag)
-- ARGV[1]  fence         the writer's fence (integer >= 1)
-- ARGV[2]  value         the value to SET
--
-- returns  {1, highest}  written; highest = the highest fence accepted before this write (0: none)
--          {0, highest}  rejected, nothing written: a newer holder already wrote with `highest`
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < highest then
  return {0, highest}
end
if fence > highest then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('SET', KEYS[2], ARGV[2])
return {1, highest}

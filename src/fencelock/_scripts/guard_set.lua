-- guard_set: the Redis fencing guard. Write a value only if its fence is not older than one already accepted.
-- The rule is `fencelock._logic.fencing.accepts`: accept when fence >= highest accepted, else reject.
--
-- KEYS[1]  guard key     fencelock:{name}:guard   (highest fence accepted for this name, no TTL)
-- KEYS[2]  data key      the key to write (on Redis Cluster it must share the guard key's hash tag)
-- ARGV[1]  fence         the writer's fence: a decimal integer in 1..2^63-1 without leading zeros (the client
--                        checks it), compared as a string: a Lua number (a double) cannot tell 2^53 + 1 from
--                        2^53, so it would accept a stale write above 2^53
-- ARGV[2]  value         the value to SET
--
-- returns  {1, highest}  written; highest = the highest fence accepted before this write ('0': none)
--          {0, highest}  rejected, nothing written: a newer holder already wrote with `highest`
--                        (highest is a decimal string, every digit kept)
local highest = redis.call('GET', KEYS[1]) or '0'
local fence = ARGV[1]
-- Canonical decimals of positive integers: the longer is the larger; of equal length, the first digit that
-- differs decides (byte by byte: Lua's `<` on strings follows the server's locale).
local order = #fence - #highest
local i = 1
while order == 0 and i <= #fence do
  order = string.byte(fence, i) - string.byte(highest, i)
  i = i + 1
end
if order < 0 then
  return {0, highest}
end
if order > 0 then
  redis.call('SET', KEYS[1], fence)
end
redis.call('SET', KEYS[2], ARGV[2])
return {1, highest}

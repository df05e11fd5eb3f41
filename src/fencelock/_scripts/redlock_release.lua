-- redlock_release: delete one node's key only if it is this grant's (same token AND same proposal t).
-- Matching t as well as the token means a late release of an earlier, failed round of the same acquisition
-- can never delete a later round's grant. It also raises the node's hwm to t: when the release overtakes the
-- round's own acquire on this node (another connection, a slow node), that late acquire is then refused
-- instead of leaving a dead lease's key for a whole TTL. Raising an hwm is always safe.
--
-- KEYS[1]  lock key      fencelock:{name}:lock
-- KEYS[2]  hwm key       fencelock:{name}:fence
-- KEYS[3]  waiters key   fencelock:{name}:waiters
-- KEYS[4]  wake key      fencelock:{name}:wake    (list that waiters BLPOP)
-- ARGV[1]  token
-- ARGV[2]  t             the grant's proposal; 0 = any grant of this token (cleanup of an abandoned attempt)
--
-- returns  1             released
--          0             the key is gone and nothing was granted here after us (it expired)
--          -1            another holder has the key, or a later proposal was granted here
local hwm = tonumber(redis.call('GET', KEYS[2]) or '0')
local t = tonumber(ARGV[2])
local holder = redis.call('GET', KEYS[1])
if t > hwm and (not holder or holder == ARGV[1]) then
  -- (Never under another holder's key: its extend and release must still find hwm == its t.)
  redis.call('SET', KEYS[2], ARGV[2])
  hwm = t
end
if holder == ARGV[1] and (t == 0 or hwm == t) then
  redis.call('DEL', KEYS[1])
  local pttl = redis.call('PTTL', KEYS[3])
  if pttl > 0 then
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], ARGV[2])
    redis.call('PEXPIRE', KEYS[4], pttl)
  end
  return 1
end
if not holder and hwm <= t then
  return 0
end
return -1

-- extend_many: the renewal watchdog's batch: compare-and-pexpire for many leases in one call.
-- On Redis Cluster every key of one call must be in one hash slot (the client groups them so).
--
-- KEYS[i]      lock key of lease i     fencelock:{name}:lock
-- ARGV[2i-1]   token of lease i
-- ARGV[2i]     ttl of lease i, milliseconds from now
--
-- returns      an array: 1 where lease i was extended, 0 where it is not ours any more
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

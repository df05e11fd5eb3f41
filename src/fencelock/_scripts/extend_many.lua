-- extend_many: the renewal watchdog's batch: compare-and-pexpire for many leases in one call.
-- On Redis Cluster every key of one call must be in one hash slot (the client groups them so).
--
-- KEYS[2i-1]   lock key of lease i     fencelock:{name}:lock
-- KEYS[2i]     fence key of lease i    fencelock:{name}:fence
-- ARGV[3i-2]   token of lease i
-- ARGV[3i-1]   ttl of lease i, milliseconds from now
-- ARGV[3i]     fence keep of lease i: milliseconds its fence key lives from now (never less than the ttl)
--
-- returns      an array: 1 where lease i was extended, 0 where it is not ours any more
local out = {}
for i = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * i - 1]) == ARGV[3 * i - 2] then
    redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[3 * i - 1])
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[3 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

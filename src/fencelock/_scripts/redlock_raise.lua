-- redlock_raise: raise high-water marks on a node being repaired; never lowers one.
--
-- KEYS[i]  hwm keys      fencelock:{name}:fence, one per name
-- ARGV[i]  values        the hwm for KEYS[i]: the maximum over a quorum of the other nodes
--
-- returns  the number of keys raised
local raised = 0
for i, key in ipairs(KEYS) do
  local value = tonumber(ARGV[i])
  if value > tonumber(redis.call('GET', key) or '0') then
    redis.call('SET', key, ARGV[i])
    raised = raised + 1
  end
end
return raised

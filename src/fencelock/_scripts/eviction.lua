-- eviction: whether this server may evict a held lock under memory pressure (see fencelock._redis.eviction).
-- Read-only; sent once per client and server, in the background, after the first grant there.
--
-- KEYS[1]  lock key  fencelock:{name}:lock  (never read: it routes the call to the server that holds that lock)
--
-- returns  {maxmemory, policy}
--          maxmemory  the server's memory limit in bytes; 0 when it has none
--          policy     its maxmemory-policy ("noeviction" if INFO does not say)
local info = redis.call('INFO', 'memory')
local limit = tonumber(string.match(info, '\nmaxmemory:(%d+)')) or 0
local policy = string.match(info, '\nmaxmemory_policy:([%w%-_]+)') or 'noeviction'
return {limit, policy}

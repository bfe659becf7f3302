-- revocations.lua: the version and every revocation, read atomically.
--
-- KEYS[1]  revocations hash (user id -> unix seconds)
-- KEYS[2]  version counter (same slot)
-- Returns {version or false, user, seconds, user, seconds, ...}

local out = {redis.call('GET', KEYS[2])}
local pairs = redis.call('HGETALL', KEYS[1])
for i = 1, #pairs do
  out[i + 1] = pairs[i]
end
return out

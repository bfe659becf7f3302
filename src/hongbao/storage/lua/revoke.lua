-- revoke.lua: revoke a user's tokens issued at or before a moment, and bump the version.
-- A revocation only ever moves later: an earlier moment leaves the later one in place.
--
-- KEYS[1]  revocations hash (user id -> unix seconds)
-- KEYS[2]  version counter (same slot)
-- ARGV[1]  user id
-- ARGV[2]  unix seconds: tokens with an iat at or before it are refused
-- Returns the new version.

local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local at = tonumber(ARGV[2])
if not held or held < at then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return redis.call('INCR', KEYS[2])

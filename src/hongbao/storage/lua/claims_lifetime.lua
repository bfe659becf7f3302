-- claims_lifetime.lua: give a spent packet's claims hash a lifetime when it has none.
-- grab.lua gives it the meta's when the packet's last share goes; a packet that ran out
-- under a grab.lua that did not kept its claims hash for good.
--
-- KEYS[1]  meta hash     KEYS[2]  claims hash
-- ARGV[1]  the packet's keys' end of life, unix ms (its expiry plus retention)
-- Returns 1 when the claims hash had no lifetime and got one: the meta's while the meta
-- lives, else ARGV[1] (a time past deletes it at once); 0 otherwise.

if redis.call('PTTL', KEYS[2]) ~= -1 then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
else
  redis.call('PEXPIREAT', KEYS[2], ARGV[1])
end
return 1

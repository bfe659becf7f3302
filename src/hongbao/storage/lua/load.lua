-- load.lua: put a packet into Redis, once (idempotent: a loaded packet is left alone).
--
-- KEYS[1]  meta hash     hb:{b<n>}:p:<id>:m
-- KEYS[2]  shares list   hb:{b<n>}:p:<id>:s   (unclaimed shares, LPOP order)
-- KEYS[3]  claims hash   hb:{b<n>}:p:<id>:c   (user -> "seq:amount:claimed_at_ms")
-- ARGV[1]  expires_at, unix ms (grabs refused from then on, by this server's clock)
-- ARGV[2]  keys' lifetime, unix ms (PEXPIREAT; after expiry plus retention)
-- ARGV[3]  amount still grabbable, fen (sum of the shares below)
-- ARGV[4]  n, the number of shares that follow
-- ARGV[5 .. 4+n]        shares, each packed as index * 2^32 + amount
-- ARGV[5+n ..]          earlier claims (when rebuilding), pairs: user, "seq:amount:ms"
-- Returns 1 when the packet was loaded now, 0 when it was there already.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local n = tonumber(ARGV[4])
local chunk = 1000  -- unpack() has a stack limit; push in slices
for first = 5, 4 + n, chunk do
  local last = math.min(first + chunk - 1, 4 + n)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, last))
end
for i = 5 + n, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'exp', ARGV[1], 'left', ARGV[3])
for i = 1, 3 do
  redis.call('PEXPIREAT', KEYS[i], ARGV[2])
end
return 1

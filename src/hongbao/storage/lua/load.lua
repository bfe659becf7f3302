-- load.lua: put a packet into Redis, once (idempotent: a loaded packet is left alone).
--
-- KEYS[1]  meta hash     hb:{b<n>}:p:<id>:m
-- KEYS[2]  shares list   hb:{b<n>}:p:<id>:s   (unclaimed shares, LPOP order)
-- KEYS[3]  claims hash   hb:{b<n>}:p:<id>:c   (user -> "seq:amount:claimed_at_ms")
-- KEYS[4]  audience set  hb:{b<n>}:p:<id>:a   (the users who may grab; empty: anyone)
-- ARGV[1]  expires_at, unix ms (grabs refused from then on, by this server's clock)
-- ARGV[2]  keys' lifetime, unix ms (PEXPIREAT; after expiry plus retention)
-- ARGV[3]  amount still grabbable, fen (sum of the shares below)
-- ARGV[4]  n, the number of shares that follow
-- ARGV[5]  starts_at, unix ms ("" when grabs open at once)
-- ARGV[6]  the passphrase's digest ("" without a passphrase)
-- ARGV[7]  m, the number of audience users that follow the shares
-- ARGV[8 .. 7+n]            shares, each packed as index * 2^32 + amount
-- ARGV[8+n .. 7+n+m]        the audience's user ids
-- ARGV[8+n+m ..]            earlier claims (when rebuilding), pairs: user, "seq:amount:ms"
-- Returns 1 when the packet was loaded now, 0 when it was there already.
-- A packet with rules gets r=1 in its meta (grab.lua reads the rules only then), with
-- st (starts_at), ph (digest) and an (audience size) as given.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local n, m = tonumber(ARGV[4]), tonumber(ARGV[7])
local chunk = 1000  -- unpack() has a stack limit; push in slices
for first = 8, 7 + n, chunk do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + chunk - 1, 7 + n)))
end
redis.call('DEL', KEYS[4])  -- a rebuild starts from the ledger's audience
for first = 8 + n, 7 + n + m, chunk do
  redis.call('SADD', KEYS[4], unpack(ARGV, first, math.min(first + chunk - 1, 7 + n + m)))
end
for i = 8 + n + m, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'exp', ARGV[1], 'left', ARGV[3])
if ARGV[5] ~= '' or ARGV[6] ~= '' or m > 0 then
  redis.call('HSET', KEYS[1], 'r', 1, 'an', m)
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'st', ARGV[5])
  end
  if ARGV[6] ~= '' then
    redis.call('HSET', KEYS[1], 'ph', ARGV[6])
  end
end
for i = 1, 4 do
  redis.call('PEXPIREAT', KEYS[i], ARGV[2])
end
return 1

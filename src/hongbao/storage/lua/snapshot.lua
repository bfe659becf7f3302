-- snapshot.lua: one packet's whole state in Redis, read atomically (for the audit).
--
-- KEYS[1]  meta hash     KEYS[2]  shares list     KEYS[3]  claims hash
-- Returns {exists, amount_left, closed, shares, claims}:
--   exists and closed are 1 or 0; shares is the list of packed unclaimed shares
--   (index * 2^32 + amount); claims is flat: user, "seq:amount:claimed_at_ms", ...
--   A packet not in Redis is {0, 0, 0, {}, {}}.

local meta = redis.call('HMGET', KEYS[1], 'exp', 'left', 'closed')
if not meta[1] then
  return {0, 0, 0, {}, {}}
end
return {
  1,
  tonumber(meta[2]) or 0,
  meta[3] and 1 or 0,
  redis.call('LRANGE', KEYS[2], 0, -1),
  redis.call('HGETALL', KEYS[3]),
}

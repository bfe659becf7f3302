-- grab.lua: one user grabs one share of one packet, atomically.
--
-- KEYS[1]  meta hash     KEYS[2]  shares list     KEYS[3]  claims hash
-- KEYS[4]  the bucket's event stream
-- ARGV[1]  packet id     ARGV[2]  user id
-- Returns {status, claim}; claim is "seq:amount:claimed_at_ms" for status 1 and 2.
--   0 unknown packet, 1 granted now, 2 claimed before (the earlier claim again),
--   3 exhausted, 4 expired (by this server's clock, or closed by the sweeper)
-- A grant also appends {k=g, p=packet, c="user claim"} to the event stream (the
-- format of grab_batch.lua's entries, with one line).

local prior = redis.call('HGET', KEYS[3], ARGV[2])
if prior then
  return {2, prior}
end
local meta = redis.call('HMGET', KEYS[1], 'exp', 'closed', 'left')
if not meta[1] then
  return {0, false}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if meta[2] or now >= tonumber(meta[1]) then
  if tonumber(meta[3]) == 0 then
    return {3, false}
  end
  return {4, false}
end
local packed = redis.call('LPOP', KEYS[2])
if not packed then
  return {3, false}
end
packed = tonumber(packed)
local index = math.floor(packed / 4294967296)
local amount = packed - index * 4294967296
local claim = string.format('%d:%d:%d', index + 1, amount, now)
redis.call('HSET', KEYS[3], ARGV[2], claim)
redis.call('HINCRBY', KEYS[1], 'left', -amount)
redis.call('XADD', KEYS[4], '*', 'k', 'g', 'p', ARGV[1], 'c', ARGV[2] .. ' ' .. claim)
return {1, claim}

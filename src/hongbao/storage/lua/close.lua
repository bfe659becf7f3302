-- close.lua: close an expired packet and emit the refund of what is left.
--
-- KEYS[1]  meta hash     KEYS[2]  shares list     KEYS[3]  claims hash
-- KEYS[4]  the bucket's event stream
-- ARGV[1]  packet id     ARGV[2]  sender id
-- ARGV[3]  retention, ms: the keys live this long after closing (repeat grabs still answered)
-- Returns {status, amount_left, shares_left}:
--   0 unknown packet, 1 closed now (refund event appended), 2 closed before,
--   3 not expired yet (by this server's clock)
-- Closing appends {k=r, p=packet, s=sender, a=amount_left, n=shares_left, t=ms}.

local meta = redis.call('HMGET', KEYS[1], 'exp', 'closed', 'left')
if not meta[1] then
  return {0, 0, 0}
end
if meta[2] then
  return {2, 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(meta[1]) then
  return {3, 0, 0}
end
local left = tonumber(meta[3])
local n = redis.call('LLEN', KEYS[2])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'closed', now, 'nleft', n)
redis.call('XADD', KEYS[4], '*', 'k', 'r', 'p', ARGV[1], 's', ARGV[2],
  'a', string.format('%d', left), 'n', n, 't', now)
local until_ms = now + tonumber(ARGV[3])
redis.call('PEXPIREAT', KEYS[1], until_ms)
redis.call('PEXPIREAT', KEYS[3], until_ms)
return {1, left, n}

-- cancel.lua: close an open packet at once for its sender and emit the refund of what
-- is left; atomic with respect to grabs (a grab after it finds the packet cancelled)
-- and to close.lua (whichever closes the packet first appends the only refund).
--
-- KEYS[1]  meta hash     KEYS[2]  shares list     KEYS[3]  claims hash
-- KEYS[4]  the bucket's event stream
-- ARGV[1]  packet id     ARGV[2]  sender id
-- ARGV[3]  retention, ms: the keys live at least this long after closing (repeat grabs
--          still answered), and never less long than they would have: until the ledger
--          has the refund, a packet missing from Redis is rebuilt from the ledger as open
-- Returns {status, amount_left, shares_left}:
--   0 unknown packet, 1 cancelled now (refund event appended), 2 cancelled before (the
--   same amounts again), 3 closed before at its expiry (the amounts it closed with),
--   4 expired (by this server's clock; the sweeper closes it), 5 exhausted (no share
--   left to give back)
-- Cancelling marks the meta closed=ms, nleft=shares left and cx=1, and appends
-- {k=r, p=packet, s=sender, a=amount_left, n=shares_left, t=ms, x=c}.

local meta = redis.call('HMGET', KEYS[1], 'exp', 'closed', 'left', 'nleft', 'cx')
if not meta[1] then
  return {0, 0, 0}
end
if meta[2] then
  return {meta[5] and 2 or 3, tonumber(meta[3]), tonumber(meta[4])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(meta[1]) then
  return {4, 0, 0}
end
local n = redis.call('LLEN', KEYS[2])
local left = tonumber(meta[3])
if n == 0 then
  return {5, 0, 0}
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'closed', now, 'nleft', n, 'cx', 1)
redis.call('XADD', KEYS[4], '*', 'k', 'r', 'p', ARGV[1], 's', ARGV[2],
  'a', string.format('%d', left), 'n', n, 't', now, 'x', 'c')
local ttl = math.max(tonumber(ARGV[3]), redis.call('PTTL', KEYS[1]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {1, left, n}

-- status.lua: a consistent snapshot of a packet's live state.
--
-- KEYS[1]  meta hash     KEYS[2]  shares list
-- Returns {exists, amount_left, shares_left (at closing, once closed), expires_at_ms,
-- closed_at_ms or 0, now_ms, cancelled (1 or 0)}
-- (exists is 0 when the packet is not in Redis; the other items are then 0).

local meta = redis.call('HMGET', KEYS[1], 'exp', 'closed', 'left', 'nleft', 'cx')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not meta[1] then
  return {0, 0, 0, 0, 0, now, 0}
end
-- a closed packet's shares are gone; 'nleft' remembers how many there were
local shares_left = tonumber(meta[4] or redis.call('LLEN', KEYS[2]))
return {1, tonumber(meta[3]), shares_left, tonumber(meta[1]), tonumber(meta[2] or 0), now,
  meta[5] and 1 or 0}

-- grab_batch.lua: many grabs, of one or more packets of one bucket, in one call.
-- The coalescing path: same rules as grab.lua, applied in order, so a user
-- appearing twice in a batch is granted once and told "claimed before" after.
-- A packet's meta is read once per call and its amount left updated once per call.
--
-- KEYS[1]                 the bucket's event stream
-- KEYS[2+3j .. 4+3j]      meta hash, shares list, claims hash of packet j (j = 0 ..)
-- ARGV[1]                 m, the number of packets
-- ARGV[2 .. 1+m]          packet ids, in the order of their keys
-- ARGV[2+m ..]            pairs: packet position (1 .. m), user id
-- Returns a flat list, two items per pair: status, claim (as grab.lua).

local m = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = string.format('%d', now)
local packets = {}  -- position -> {status = open (-1) or a refusal code, taken = fen}
local out = {}
for i = 2 + m, #ARGV, 2 do
  local j = tonumber(ARGV[i])
  local shares_key, claims_key = KEYS[3 * j], KEYS[3 * j + 1]
  local user = ARGV[i + 1]
  local status, claim = 0, false
  local prior = redis.call('HGET', claims_key, user)
  if prior then
    status, claim = 2, prior
  else
    local p = packets[j]
    if not p then
      local meta = redis.call('HMGET', KEYS[3 * j - 1], 'exp', 'closed', 'left')
      if not meta[1] then
        p = {status = 0, taken = 0}
      elseif meta[2] or now >= tonumber(meta[1]) then
        p = {status = (tonumber(meta[3]) == 0) and 3 or 4, taken = 0}
      else
        p = {status = -1, taken = 0}
      end
      packets[j] = p
    end
    if p.status ~= -1 then
      status = p.status
    else
      local packed = redis.call('LPOP', shares_key)
      if not packed then
        status = 3
        p.status = 3
      else
        packed = tonumber(packed)
        local index = math.floor(packed / 4294967296)
        local amount = packed - index * 4294967296
        claim = string.format('%d:%d:', index + 1, amount) .. now_text
        redis.call('HSET', claims_key, user, claim)
        redis.call('XADD', KEYS[1], '*', 'k', 'c', 'p', ARGV[1 + j], 'u', user, 'c', claim)
        p.taken = p.taken + amount
        status = 1
      end
    end
  end
  out[#out + 1] = status
  out[#out + 1] = claim
end
for j, p in pairs(packets) do
  if p.taken > 0 then
    redis.call('HINCRBY', KEYS[3 * j - 1], 'left', -p.taken)
  end
end
return out

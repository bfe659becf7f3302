-- grab_batch.lua: many grabs, of one or more packets of one bucket, in one call.
-- The coalescing path: same rules as grab.lua, applied in order, so a user
-- appearing twice for a packet is granted once and told "claimed before" after.
-- Per packet and call, the meta is read once, the amount left updated once, and
-- all grants go to the stream as one entry (XADD dominated the cost per grab).
--
-- KEYS[1]                 the bucket's event stream
-- KEYS[2+3j .. 4+3j]      meta hash, shares list, claims hash of packet j (j = 0 ..)
-- ARGV[1+2j]              packet id of packet j
-- ARGV[2+2j]              user ids grabbing packet j, in order, separated by one space
-- Returns a flat list of integers, four per grab, packet by packet, users in order:
--   status (as grab.lua), seq, amount, claimed_at_ms (the last three 0 without a claim)
-- Appends per packet with grants {k=g, p=packet, c=lines "user seq:amount:claimed_at_ms"}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claim_tail = ':' .. string.format('%d', now)
local out = {}
local n = 0
for j = 0, #ARGV / 2 - 1 do
  local meta_key, shares_key, claims_key = KEYS[2 + 3 * j], KEYS[3 + 3 * j], KEYS[4 + 3 * j]
  local state = nil  -- nil until the meta is needed; then -1 open, or a refusal status
  local taken, grants = 0, {}
  for user in string.gmatch(ARGV[2 + 2 * j], '%S+') do
    local status, seq, amount, at = 0, 0, 0, 0
    local prior = redis.call('HGET', claims_key, user)
    if prior then
      local s, a, ms = string.match(prior, '^(%d+):(%d+):(%d+)$')
      status, seq, amount, at = 2, tonumber(s), tonumber(a), tonumber(ms)
    else
      if state == nil then
        local meta = redis.call('HMGET', meta_key, 'exp', 'closed', 'left')
        if not meta[1] then
          state = 0
        elseif meta[2] or now >= tonumber(meta[1]) then
          state = (tonumber(meta[3]) == 0) and 3 or 4
        else
          state = -1
        end
      end
      status = state
      if state == -1 then
        local packed = redis.call('LPOP', shares_key)
        if not packed then
          status, state = 3, 3
        else
          packed = tonumber(packed)
          seq = math.floor(packed / 4294967296) + 1
          amount = packed - (seq - 1) * 4294967296
          at = now
          local claim = string.format('%d:%d', seq, amount) .. claim_tail
          redis.call('HSET', claims_key, user, claim)
          grants[#grants + 1] = user .. ' ' .. claim
          taken = taken + amount
          status = 1
        end
      end
    end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, seq, amount, at
    n = n + 4
  end
  if taken > 0 then
    redis.call('HINCRBY', meta_key, 'left', -taken)
    redis.call('XADD', KEYS[1], '*', 'k', 'g', 'p', ARGV[1 + 2 * j], 'c', table.concat(grants, '\n'))
  end
end
return out

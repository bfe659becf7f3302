-- grab_batch.lua: many grabs, of one or more packets, in one call.
-- The coalescing path: same rules as grab.lua, applied in order, so a user
-- appearing twice for a packet is granted once and told "claimed before" after.
-- Per packet and call, the meta is read once, the amount left updated once, and
-- all grants go to the stream as one entry (XADD dominated the cost per grab).
-- A packet whose keys cannot be read (wrong type, malformed values) fails only its
-- own grabs: they get status 5 from the first one that could not be served, and the
-- grants made before that still reach the stream.
--
-- KEYS[1+4j .. 4+4j]      event stream of its bucket, meta hash, shares list, claims hash
--                         of packet j (j = 0 ..); on a cluster all in one slot (bucket)
-- ARGV[1+2j]              packet id of packet j
-- ARGV[2+2j]              user ids grabbing packet j, in order, separated by one space
-- Returns a flat list of integers, four per grab, packet by packet, users in order:
--   status (as grab.lua; 5 = this packet's data is unreadable), seq, amount,
--   claimed_at_ms (the last three 0 without a claim)
-- Appends per packet with grants {k=g, p=packet, c=lines "user seq:amount:claimed_at_ms"}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claim_tail = ':' .. string.format('%d', now)
local out = {}
local n = 0

local function put(status, seq, amount, at)
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, seq, amount, at
  n = n + 4
end

-- grabs of one packet, in order; grants and the amount taken are kept in `done`
-- as they happen, so that they are recorded even if a later grab raises
local function grab_packet(meta_key, shares_key, claims_key, users, done)
  local state = nil  -- nil until the meta is needed; then -1 open, or a refusal status
  for _, user in ipairs(users) do
    local prior = redis.call('HGET', claims_key, user)
    if prior then
      local s, a, ms = string.match(prior, '^(%d+):(%d+):(%d+)$')
      if not s then
        error('malformed claim of ' .. user)
      end
      put(2, tonumber(s), tonumber(a), tonumber(ms))
    else
      if state == nil then
        local meta = redis.call('HMGET', meta_key, 'exp', 'closed', 'left')
        local exp = tonumber(meta[1])
        if not meta[1] then
          state = 0
        elseif not exp then
          error('malformed expiry')
        elseif meta[2] or now >= exp then
          state = (tonumber(meta[3]) == 0) and 3 or 4
        else
          state = -1
        end
      end
      local packed = state == -1 and tonumber(redis.call('LPOP', shares_key))
      if state ~= -1 then
        put(state, 0, 0, 0)
      elseif not packed then
        state = 3
        put(3, 0, 0, 0)
      else
        local seq = math.floor(packed / 4294967296) + 1
        local amount = packed - (seq - 1) * 4294967296
        local claim = string.format('%d:%d', seq, amount) .. claim_tail
        redis.call('HSET', claims_key, user, claim)
        done.grants[#done.grants + 1] = user .. ' ' .. claim
        done.taken = done.taken + amount
        put(1, seq, amount, now)
      end
    end
  end
end

for j = 0, #ARGV / 2 - 1 do
  local users = {}
  for user in string.gmatch(ARGV[2 + 2 * j], '%S+') do
    users[#users + 1] = user
  end
  local first = n
  local done = {grants = {}, taken = 0}
  local ok = pcall(grab_packet, KEYS[2 + 4 * j], KEYS[3 + 4 * j], KEYS[4 + 4 * j], users, done)
  if not ok then
    for _ = (n - first) / 4 + 1, #users do
      put(5, 0, 0, 0)
    end
  end
  if done.taken > 0 then
    redis.call('XADD', KEYS[1 + 4 * j], '*', 'k', 'g', 'p', ARGV[1 + 2 * j],
      'c', table.concat(done.grants, '\n'))
    redis.pcall('HINCRBY', KEYS[2 + 4 * j], 'left', -done.taken)
  end
end
return out

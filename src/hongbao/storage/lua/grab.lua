-- grab.lua: grabs of one or more packets, one or more users each, in one atomic call.
-- A single grab is a call with one packet and one user; the coalescer sends many.
-- Grabs apply in order, so a user appearing twice for a packet is granted once and
-- told "claimed before" after.
-- Per packet and call the work is done in bulk, a handful of commands whatever the
-- number of grabs (each command a script runs costs, and is written to the AOF, far
-- more than the Lua around it): one HMGET of the users' claims, one HMGET of the
-- meta, one LPOP of as many shares as there are users without a claim, one HSET of
-- the new claims, one XADD of all the grants, one HINCRBY of the amount left. A
-- packet with a single grab in the call takes the same steps with HGET/LPOP/HSET.
-- A packet whose keys cannot be read (wrong type, malformed values) fails only its
-- own grabs: they all get status 5 and none of its shares is taken.
--
-- KEYS[1+4j .. 4+4j]      event stream of its bucket, meta hash, shares list, claims hash
--                         of packet j (j = 0 ..); on a cluster all in one slot (bucket)
-- ARGV[1+2j]              packet id of packet j
-- ARGV[2+2j]              grabbers of packet j, in order, separated by one space: a
--                         user id, or "user=actor" when a service (the actor) grabs for
--                         the user (user ids hold neither '=' nor spaces)
-- Returns a flat list of integers, four per grab, packet by packet, users in order:
--   status, seq, amount, claimed_at_ms (the last three 0 when the user holds no share)
--   status: 0 unknown packet, 1 granted now, 2 claimed before (the earlier claim
--   again), 3 exhausted, 4 expired (by this server's clock, or closed),
--   5 this packet's data is unreadable
-- Shares are packed index * 2^32 + amount; claims are "seq:amount:claimed_at_ms" with
-- seq = index + 1 (see hongbao/storage/codec.py).
-- Appends per packet with grants {k=g, p=packet, c=lines "user seq:amount:claimed_at_ms"},
-- a line ending in " actor" for a grant made by an actor.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claim_tail = ':' .. string.format('%d', now)
local out = {}
local n = 0

local function put(status, seq, amount, at)
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, seq, amount, at
  n = n + 4
end

local CHUNK = 1000  -- unpack() has a stack limit: commands take their arguments in slices

-- a claim held before ("seq:amount:claimed_at_ms"), answered as status 2
local function put_prior(claim, user)
  local s, a, ms = string.match(claim, '^(%d+):(%d+):(%d+)$')
  if not s then
    error('malformed claim of ' .. user)
  end
  put(2, tonumber(s), tonumber(a), tonumber(ms))
end

-- a popped share (index * 2^32 + amount): its seq, amount and claim text; nil if malformed
local function share_claim(text)
  local packed = tonumber(text)
  if not packed then
    return nil
  end
  local index = math.floor(packed / 4294967296)
  local amount = packed - index * 4294967296
  return index + 1, amount, string.format('%d:%d', index + 1, amount) .. claim_tail
end

-- user -> the claim text (prior or granted now), or false when the user holds none
local function read_claims(claims_key, users)
  local claimed = {}
  for first = 1, #users, CHUNK do
    local last = math.min(first + CHUNK - 1, #users)
    local priors = redis.call('HMGET', claims_key, unpack(users, first, last))
    for i = first, last do
      local prior = priors[i - first + 1]
      if prior and not string.match(prior, '^%d+:%d+:%d+$') then
        error('malformed claim of ' .. users[i])
      end
      claimed[users[i]] = prior
    end
  end
  return claimed
end

-- -1 when the packet takes grabs, else the status for a user without a claim
local function packet_state(meta_key)
  local meta = redis.call('HMGET', meta_key, 'exp', 'closed', 'left')
  local exp = tonumber(meta[1])
  if not meta[1] then
    return 0
  elseif not exp then
    error('malformed expiry')
  elseif meta[2] or now >= exp then
    return (tonumber(meta[3]) == 0) and 3 or 4
  end
  return -1
end

-- shares popped before a malformed one was found go back to the list's head, in order
local function push_back(shares_key, raw)
  local reversed = {}
  for i = #raw, 1, -1 do
    reversed[#reversed + 1] = raw[i]
  end
  for first = 1, #reversed, CHUNK do  -- LPUSH of the last first: the order is kept
    redis.call('LPUSH', shares_key, unpack(reversed, first, math.min(first + CHUNK - 1, #reversed)))
  end
end

-- a grant's line for the event stream: "user claim", or "user claim actor"; `actors` is
-- nil for the (usual) packets no actor grabbed in this call
local function grant_line(user, claim, actors)
  local actor = actors and actors[user]
  if actor then
    return user .. ' ' .. claim .. ' ' .. actor
  end
  return user .. ' ' .. claim
end

-- a packet with one grab in the call (most of them, from HTTP workers' small calls):
-- the same steps with single-value commands, which skip the bulk path's tables
local function grab_one(meta_key, shares_key, claims_key, user, done, actors)
  local prior = redis.call('HGET', claims_key, user)
  if prior then
    return put_prior(prior, user)
  end
  local state = packet_state(meta_key)
  local raw = state == -1 and redis.call('LPOP', shares_key)
  if state ~= -1 then
    return put(state, 0, 0, 0)
  elseif not raw then
    return put(3, 0, 0, 0)
  end
  local seq, amount, claim = share_claim(raw)
  if not seq then
    push_back(shares_key, {raw})
    error('malformed share')
  end
  redis.call('HSET', claims_key, user, claim)
  done.grants[1], done.taken = grant_line(user, claim, actors), amount
  put(1, seq, amount, now)
end

-- the grabs of one packet, users in order; the grants are added to `done`
local function grab_packet(meta_key, shares_key, claims_key, users, done, actors)
  if #users == 1 then
    return grab_one(meta_key, shares_key, claims_key, users[1], done, actors)
  end
  local claimed = read_claims(claims_key, users)
  local wanting = {}  -- users without a claim, each once, in order of arrival
  for _, user in ipairs(users) do
    if claimed[user] == false then
      claimed[user] = nil
      wanting[#wanting + 1] = user
    end
  end
  local state = #wanting > 0 and packet_state(meta_key) or -1
  local raw = state == -1 and redis.call('LPOP', shares_key, #wanting) or {}
  if state == -1 then
    state = 3  -- the users the shares did not reach find the packet exhausted
  end
  -- share k goes to wanting[k]: claimed[user] = k, its claim is fields[2k]
  local fields, seqs, amounts, lines, taken = {}, {}, {}, {}, 0
  for k, text in ipairs(raw) do
    local seq, amount, claim = share_claim(text)
    if not seq then
      push_back(shares_key, raw)
      error('malformed share')
    end
    local user = wanting[k]
    fields[2 * k - 1], fields[2 * k] = user, claim
    seqs[k], amounts[k] = seq, amount
    lines[k], taken = grant_line(user, claim, actors), taken + amount
    claimed[user] = k
  end
  for first = 1, #fields, CHUNK do
    redis.call('HSET', claims_key, unpack(fields, first, math.min(first + CHUNK - 1, #fields)))
  end
  done.grants, done.taken = lines, taken
  for _, user in ipairs(users) do
    local claim = claimed[user]
    if type(claim) == 'number' then
      put(1, seqs[claim], amounts[claim], now)
      claimed[user] = fields[2 * claim]
    elseif claim then
      put_prior(claim, user)  -- read_claims checked its form: no error after the writes
    else
      put(state, 0, 0, 0)
    end
  end
end

for j = 0, #ARGV / 2 - 1 do
  local grabbers = ARGV[2 + 2 * j]
  local users, actors = {}, nil
  if string.find(grabbers, '=', 1, true) then
    actors = {}  -- a user named twice keeps the actor of its first grab (the one granted)
    for user, actor in string.gmatch(grabbers, '([^%s=]+)=?(%S*)') do
      users[#users + 1] = user
      if actor ~= '' and not actors[user] then
        actors[user] = actor
      end
    end
  else
    for user in string.gmatch(grabbers, '%S+') do
      users[#users + 1] = user
    end
  end
  local first = n
  local done = {grants = {}, taken = 0}
  local ok = pcall(grab_packet, KEYS[2 + 4 * j], KEYS[3 + 4 * j], KEYS[4 + 4 * j], users, done,
    actors)
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

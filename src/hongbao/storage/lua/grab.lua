-- grab.lua: grabs of one or more packets, one or more users each, in one atomic call.
-- A single grab is a call with one packet and one user; the coalescer sends many.
-- Grabs apply in order, so a user appearing twice for a packet is granted once and
-- told "claimed before" after.
-- Per packet and call the work is done in bulk, a handful of commands whatever the
-- number of grabs (each command a script runs costs, and is written to the AOF, far
-- more than the Lua around it): one HMGET of the users' claims, one HMGET of the
-- meta, one LPOP of as many shares as there are users without a claim, one HSET of
-- the new claims, one XADD of all the grants, one HINCRBY of the amount left. A
-- packet with a single grab in the call takes the same steps with HGET/LPOP/HSET, and a
-- plain one (no actor, no passphrase: the shape of a storm spread over many packets)
-- builds no Lua table and parses no grabber on the way, which saves 12-15% of what such
-- a grab costs the script (callgrind, docs/performance.md).
-- A packet whose keys cannot be read (wrong type, malformed values) fails only its
-- own grabs: they all get status 5 and none of its shares is taken.
--
-- Rules. A packet with rules has the field r in its meta (read with the fields every
-- grab reads, so a packet without rules pays nothing for them); then one more HMGET
-- reads st (start, unix ms), ph (the passphrase's digest) and an (audience size):
--   * before st every user without a claim gets status 9 and the ms until st;
--   * with an audience, SMISMEMBER of the users without a claim: others get status 6;
--   * with a passphrase, each grab carries its digest (see ARGV); a grab without one
--     gets status 7; a wrong one also counts in the tries hash (user -> "wrong:until_ms"),
--     and the 5th wrong one locks the user out for 600,000 ms (status 8 with the ms left,
--     also for any grab of theirs until then); a lockout that ended starts a new count.
-- A user who holds a claim always gets it back (status 2), whatever the rules.
--
-- KEYS[1+4j .. 4+4j]      event stream of its bucket, meta hash, shares list, claims
--                         hash of packet j (j = 0 .. P-1); then the audience set and
--                         tries hash of each packet ARGV[1] names, in its order; on a
--                         cluster all in one slot (bucket)
-- ARGV[1]                 the packets (their j, separated by one space) whose audience
--                         and tries keys follow: the packets the caller knows to have
--                         rules, usually none (""): a packet without rules needs no
--                         such keys, and every key a call names costs the script work
-- ARGV[2+2j]              packet id of packet j
-- ARGV[3+2j]              grabbers of packet j, in order, separated by one space: a
--                         user id, then "=actor" when a service (the actor) grabs for
--                         the user, then "/digests" when the grab carries a passphrase
--                         (its digests under each passphrase key, separated by ","); user
--                         ids hold none of '=', '/', ',' or spaces
-- Returns a flat list of integers, four per grab, packet by packet, users in order, and
-- last the number of packets answered with status 11:
--   status, seq, amount, claimed_at_ms (the last three 0 when the user holds no share;
--   for statuses 8 and 9 the last is the ms to wait)
--   status: 0 unknown packet, 1 granted now, 2 claimed before (the earlier claim
--   again), 3 exhausted, 4 expired (by this server's clock, or closed),
--   5 this packet's data is unreadable, 6 not in the audience, 7 wrong passphrase,
--   8 locked out after wrong passphrases, 9 not started, 10 cancelled, 11 the packet
--   has rules and ARGV[1] did not name it: nothing of it changed, and a call naming it
--   (with its audience and tries keys) grabs (a user with a claim gets status 2)
-- Shares are packed index * 2^32 + amount; claims are "seq:amount:claimed_at_ms" with
-- seq = index + 1 (see hongbao/storage/codec.py).
-- Appends the grants as lines "user seq:amount:claimed_at_ms", a line ending in " actor"
-- for a grant made by an actor: in a call of fewer than 32 packets one entry per packet
-- with grants, {k=g, p=packet, c=lines}; in a call of 32 or more, one entry per stream,
-- {k=m, packet=lines, packet=lines, ...} (at most 499 packets an entry).

-- What a plain grab uses on its way, held in locals: each use of a global is a lookup
-- in the globals table, a local's is not. Each local a function uses is an upvalue its
-- closure captures anew on every call of the script, so the functions a plain grab does
-- not run reach the library through the globals.
local call, pcall_redis = redis.call, redis.pcall
local format, find, match = string.format, string.find, string.match
local floor, tonumber = math.floor, tonumber
local KEYS, ARGV = KEYS, ARGV

local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local claim_tail = ':' .. format('%d', now)
local out = {}
local n = 0
local WRONG_TRIES, LOCKOUT_MS = 5, 600000
local NO_RULES_KEYS = 11
local resend = 0  -- packets answered NO_RULES_KEYS
local PACKETS = (#ARGV - 1) / 2

-- j -> the index in KEYS of packet j's audience key (its tries key follows), for the
-- packets ARGV[1] names; nil when it names none
local rules_keys = nil
if ARGV[1] ~= '' then
  rules_keys = {}
  local at = 4 * PACKETS + 1
  for j in string.gmatch(ARGV[1], '%d+') do
    rules_keys[tonumber(j)], at = at, at + 2
  end
end

local function put(status, seq, amount, at)
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, seq, amount, at
  n = n + 4
end

local CHUNK = 1000  -- unpack() has a stack limit: commands take their arguments in slices

-- a claim held before ("seq:amount:claimed_at_ms"), answered as status 2
local function put_prior(claim, user)
  local s, a, ms = match(claim, '^(%d+):(%d+):(%d+)$')
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
  local index = floor(packed / 4294967296)
  local amount = packed - index * 4294967296
  return index + 1, amount, format('%d:%d', index + 1, amount) .. claim_tail
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

-- the status of a packet that takes no more grabs: 10 cancelled, 3 exhausted (nothing
-- left), 4 expired (or closed at its expiry)
local function ended(meta_key, closed)
  local meta = redis.call('HMGET', meta_key, 'cx', 'left')
  if closed and meta[1] then
    return 10
  end
  return (tonumber(meta[2]) == 0) and 3 or 4
end

-- -1 when the packet takes grabs, else the status for a user without a claim (and the
-- ms to wait, for status 9); with -1, the packet's rules when it has any
local function packet_state(meta_key)
  local meta = call('HMGET', meta_key, 'exp', 'closed', 'r')
  local exp = tonumber(meta[1])
  if not meta[1] then
    return 0, 0
  elseif not exp then
    error('malformed expiry')
  elseif meta[2] or now >= exp then
    return ended(meta_key, meta[2]), 0
  elseif not meta[3] then
    return -1, 0
  end
  local rules = call('HMGET', meta_key, 'st', 'ph', 'an')
  local start = tonumber(rules[1])
  if start and now < start then
    return 9, start - now
  end
  return -1, 0, {phrase = rules[2], audience = (tonumber(rules[3]) or 0) > 0}
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

-- whether a grab's digests ("d1,d2") hold the packet's passphrase digest
local function phrase_matches(digests, phrase)
  return string.find(',' .. digests .. ',', ',' .. phrase .. ',', 1, true) ~= nil
end

-- Under the packet's rules, which of `fresh` (the users without a claim, each once, in
-- order) may take a share: returns them (each once, in order), the verdict {status,
-- wait_ms} of each refused grab by position in `users`, and the tries to write (user ->
-- "wrong:until_ms"), nil when none changed. Reads only: the caller writes.
local function admit(keys, users, fresh, attempts, rules)
  local member, tries = nil, nil
  if rules.audience then
    member = {}
    for first = 1, #fresh, CHUNK do
      local last = math.min(first + CHUNK - 1, #fresh)
      local found = redis.call('SMISMEMBER', keys.audience, unpack(fresh, first, last))
      for i = first, last do
        member[fresh[i]] = found[i - first + 1] == 1
      end
    end
  end
  if rules.phrase then
    tries = {}
    for first = 1, #fresh, CHUNK do
      local last = math.min(first + CHUNK - 1, #fresh)
      local found = redis.call('HMGET', keys.tries, unpack(fresh, first, last))
      for i = first, last do
        local wrong, until_ms = 0, 0
        if found[i - first + 1] then
          wrong, until_ms = string.match(found[i - first + 1], '^(%d+):(%d+)$')
          if not wrong then
            error('malformed tries of ' .. fresh[i])
          end
        end
        tries[fresh[i]] = {tonumber(wrong), tonumber(until_ms)}
      end
    end
  end
  local admitted, verdicts, changed, taken = {}, {}, nil, {}
  local is_fresh = {}
  for _, user in ipairs(fresh) do
    is_fresh[user] = true
  end
  for i, user in ipairs(users) do
    if is_fresh[user] and not taken[user] then
      local status, wait = nil, 0
      if member and not member[user] then
        status = 6
      elseif tries then
        local try = tries[user]
        local attempt = attempts and attempts[i]
        if try[2] > now then
          status, wait = 8, try[2] - now
        elseif not attempt then
          status = 7  -- no passphrase sent: refused, but not a guess
        elseif not phrase_matches(attempt, rules.phrase) then
          try[1] = try[1] + 1
          status = 7
          if try[1] >= WRONG_TRIES then
            try[1], try[2] = 0, now + LOCKOUT_MS
            status, wait = 8, LOCKOUT_MS
          end
          changed = changed or {}
          changed[user] = string.format('%d:%d', try[1], try[2])
        end
      end
      if status then
        verdicts[i] = {status, wait}
      else
        taken[user] = true
        admitted[#admitted + 1] = user
      end
    end
  end
  return admitted, verdicts, changed
end

-- the wrong tries counted in this call, kept as long as the packet's other keys
local function write_tries(keys, changed)
  local fields = {}
  for user, value in pairs(changed) do
    fields[#fields + 1] = user
    fields[#fields + 1] = value
  end
  for first = 1, #fields, CHUNK do
    redis.call('HSET', keys.tries, unpack(fields, first, math.min(first + CHUNK - 1, #fields)))
  end
  local ttl = redis.call('PTTL', keys.meta)
  if ttl > 0 then
    redis.call('PEXPIRE', keys.tries, ttl)
  end
end

-- The grabs of one packet, users in order, once `claimed` (user -> prior claim text, or
-- nil) and the packet's state are known; `wanting` are the users without a claim, each
-- once, in order. The grants are added to `done`.
local function take(keys, users, attempts, claimed, wanting, state, wait, rules, done, actors)
  local verdicts, changed = nil, nil
  if rules then
    wanting, verdicts, changed = admit(keys, users, wanting, attempts, rules)
  end
  local raw = {}
  if state == -1 and #wanting > 0 then
    raw = redis.call('LPOP', keys.shares, #wanting) or {}
  end
  if state == -1 then
    state = 3  -- the users the shares did not reach find the packet exhausted
  end
  -- share k goes to wanting[k]: claimed[user] = k, its claim is fields[2k]
  local fields, seqs, amounts, lines, taken = {}, {}, {}, {}, 0
  for k, text in ipairs(raw) do
    local seq, amount, claim = share_claim(text)
    if not seq then
      push_back(keys.shares, raw)
      error('malformed share')
    end
    local user = wanting[k]
    fields[2 * k - 1], fields[2 * k] = user, claim
    seqs[k], amounts[k] = seq, amount
    lines[k], taken = grant_line(user, claim, actors), taken + amount
    claimed[user] = k
  end
  for first = 1, #fields, CHUNK do
    redis.call('HSET', keys.claims, unpack(fields, first, math.min(first + CHUNK - 1, #fields)))
  end
  done.grants, done.taken = lines, taken
  if changed then
    write_tries(keys, changed)  -- admit read the tries hash: no error after the writes
  end
  for i, user in ipairs(users) do
    local verdict = verdicts and verdicts[i]
    local claim = claimed[user]
    if verdict then
      put(verdict[1], 0, 0, verdict[2])
    elseif type(claim) == 'number' then
      put(1, seqs[claim], amounts[claim], now)
      claimed[user] = fields[2 * claim]
    elseif claim then
      put_prior(claim, user)  -- read_claims checked its form: no error after the writes
    else
      put(state, 0, 0, wait)
    end
  end
end

-- the keys of packet j's grabs, whose KEYS start after `base` (= 4j); nil when the
-- packet has rules and the call does not name its audience and tries keys
local function packet_keys(base)
  local at = rules_keys and rules_keys[base / 4]
  if not at then
    return nil
  end
  return {meta = KEYS[base + 2], shares = KEYS[base + 3], claims = KEYS[base + 4],
    audience = KEYS[at], tries = KEYS[at + 1]}
end

-- A packet with one grab in the call (most of them in a spread storm, and from HTTP
-- workers' small calls): the same steps with single-value commands. A plain grab (no
-- actor, no passphrase) of a packet without rules builds no table. Returns the grant's
-- line and amount, or nothing when no share went; a packet with rules has `take` add
-- its grant to `done` (a new one when nil).
local function grab_one(base, user, attempts, actors, done)
  local prior = call('HGET', KEYS[base + 4], user)
  if prior then
    return put_prior(prior, user)
  end
  local state, wait, rules = packet_state(KEYS[base + 2])
  if rules then
    local keys = packet_keys(base)
    if not keys then
      resend = resend + 1
      return put(NO_RULES_KEYS, 0, 0, 0)
    end
    done = done or {grants = {}, taken = 0}
    take(keys, {user}, attempts, {}, {user}, state, wait, rules, done, actors)
    return done.grants[1], done.taken
  end
  local raw = state == -1 and call('LPOP', KEYS[base + 3])
  if state ~= -1 then
    return put(state, 0, 0, wait)
  elseif not raw then
    return put(3, 0, 0, 0)
  end
  local seq, amount, claim = share_claim(raw)
  if not seq then
    push_back(KEYS[base + 3], {raw})
    error('malformed share')
  end
  call('HSET', KEYS[base + 4], user, claim)
  put(1, seq, amount, now)
  return grant_line(user, claim, actors), amount
end

-- the grabs of packet j, users in order; the grants are added to `done`
local function grab_packet(base, users, attempts, actors, done)
  if #users == 1 then
    local line, amount = grab_one(base, users[1], attempts, actors, done)
    if line then
      done.grants[1], done.taken = line, amount
    end
    return
  end
  local claimed = read_claims(KEYS[base + 4], users)
  local wanting = {}  -- users without a claim, each once, in order of arrival
  for _, user in ipairs(users) do
    if claimed[user] == false then
      claimed[user] = nil
      wanting[#wanting + 1] = user
    end
  end
  local state, wait, rules = -1, 0, nil
  if #wanting > 0 then
    state, wait, rules = packet_state(KEYS[base + 2])
  end
  local keys = {meta = KEYS[base + 2], shares = KEYS[base + 3], claims = KEYS[base + 4]}
  if rules then
    keys = packet_keys(base)
    if not keys then  -- the users with a claim get it; the others are sent back
      resend = resend + 1
      for _, user in ipairs(users) do
        if claimed[user] then
          put_prior(claimed[user], user)
        else
          put(NO_RULES_KEYS, 0, 0, 0)
        end
      end
      return
    end
  end
  take(keys, users, attempts, claimed, wanting, state, wait, rules, done, actors)
end

-- the grabbers of one packet (see ARGV): users in order, then the actors (by user) and
-- the attempts (by position) when any grab carries one (`marked`: a '=' or '/' is in them)
local function parse_grabbers(grabbers, marked)
  local users, actors, attempts = {}, nil, nil
  if not marked then
    for user in string.gmatch(grabbers, '%S+') do
      users[#users + 1] = user
    end
    return users, nil, nil
  end
  -- a user named twice keeps the actor of its first grab
  for token in string.gmatch(grabbers, '%S+') do
    local user, actor, attempt = string.match(token, '^([^=/]+)=?([^/]*)/?(.*)$')
    users[#users + 1] = user
    if actor ~= '' then
      actors = actors or {}
      actors[user] = actors[user] or actor
    end
    if attempt ~= '' then
      attempts = attempts or {}
      attempts[#users] = attempt
    end
  end
  return users, actors, attempts
end

-- A call of GROUP_AT packets or more (a coalesced storm spread over many packets) writes
-- one entry per stream {k=m, packet=lines, ...}, each packet once (a packet named twice
-- in the call has its lines joined): an XADD costs the script about a fifth of a
-- packet's work. A smaller call writes one entry per packet {k=g, p=packet, c=lines}:
-- few of its packets share a stream (there are 16 by default), and the grouping's
-- tables would cost more than the XADDs they save.
local GROUP_AT = 32

-- one XADD per stream of the grants in `granted` (j, lines, j, lines, ...)
local function append_grouped(granted)
  local entries, places, streams, fields = {}, {}, {}, {}
  for i = 1, #granted, 2 do
    local j = granted[i]
    local stream, packet = KEYS[4 * j + 1], ARGV[2 + 2 * j]
    local entry = entries[stream]
    if not entry or #entry >= CHUNK then  -- unpack's stack limit: a further entry
      entry = {'k', 'm'}
      entries[stream], places[stream] = entry, {}
      streams[#streams + 1], fields[#streams + 1] = stream, entry
    end
    local at = places[stream][packet]
    if at then
      entry[at] = entry[at] .. '\n' .. granted[i + 1]
    else
      entry[#entry + 1] = packet
      entry[#entry + 1] = granted[i + 1]
      places[stream][packet] = #entry
    end
  end
  for i, stream in ipairs(streams) do
    redis.call('XADD', stream, '*', unpack(fields[i]))
  end
end

-- The claims hash is created by a packet's first grant, after load.lua set the other
-- keys' lifetime, and close.lua and cancel.lua set its own: a packet whose last share
-- went is never closed, so its claims hash takes the meta's lifetime then, or it would
-- outlive the packet.
local function keep_claims_as_meta(meta_key, claims_key)
  local ttl = redis.call('PTTL', meta_key)
  if ttl > 0 then
    redis.call('PEXPIRE', claims_key, ttl)
  end
end

local granted = PACKETS >= GROUP_AT and {} or nil
for j = 0, PACKETS - 1 do
  local grabbers = ARGV[3 + 2 * j]
  local base = 4 * j
  local first = n
  local count, ok, lines, taken = 1, nil, nil, nil
  if find(grabbers, '[ =/]') then
    local users, actors, attempts = parse_grabbers(grabbers, find(grabbers, '[=/]'))
    local done = {grants = {}, taken = 0}
    count = #users
    ok = pcall(grab_packet, base, users, attempts, actors, done)
    lines, taken = table.concat(done.grants, '\n'), done.taken
  else  -- one plain grab, the usual grab of a spread storm
    ok, lines, taken = pcall(grab_one, base, grabbers)
  end
  if not ok then
    for _ = (n - first) / 4 + 1, count do
      put(5, 0, 0, 0)
    end
  end
  if taken and taken > 0 then
    if granted then
      granted[#granted + 1], granted[#granted + 2] = j, lines
    else
      call('XADD', KEYS[base + 1], '*', 'k', 'g', 'p', ARGV[2 + 2 * j], 'c', lines)
    end
    if pcall_redis('HINCRBY', KEYS[base + 2], 'left', -taken) == 0 then
      keep_claims_as_meta(KEYS[base + 2], KEYS[base + 4])
    end
  end
end
if granted and #granted > 0 then
  append_grouped(granted)
end
out[n + 1] = resend
return out

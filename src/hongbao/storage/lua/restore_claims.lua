-- restore_claims.lua: put back into a packet the claims the ledger holds and Redis forgot
-- (Redis lost data after they were granted), atomically.
--
-- KEYS[1]  meta hash     KEYS[2]  shares list     KEYS[3]  claims hash
-- KEYS[4]  the bucket's event stream
-- ARGV[1]  packet id     ARGV[2]  sender id
-- ARGV[3 ..]  the ledger's claims, four values each: user, share index, amount,
--             claimed_at_ms
-- Returns {restored, conflict, conflict, ...}: how many claims were put back, then one
-- line per ledger claim that cannot be (the user holds another share in Redis, or Redis
-- issued the share again to someone else). A packet not in Redis returns {0}.
--
-- An open packet: the share leaves the unclaimed list and the claim is written back.
-- A closed packet: its unclaimed shares are gone and its refund counted the forgotten
-- claims' money again (a refund the ledger refuses). The claims are written back and a
-- new refund of what is really left is appended {k=r, p, s, a, n, t=closed_at_ms}, with
-- x=c when the packet was cancelled (its status in the ledger says so).
-- Shares are index * 2^32 + amount; claims "seq:amount:claimed_at_ms", seq = index + 1.

local meta = redis.call('HMGET', KEYS[1], 'exp', 'closed', 'left', 'nleft', 'cx')
if not meta[1] then
  return {0}
end
local closed = meta[2]
local held = {}  -- seqs held by a claim in Redis (only needed once closed)
if closed then
  local values = redis.call('HVALS', KEYS[3])
  for _, value in ipairs(values) do
    held[tonumber(string.match(value, '^(%d+):'))] = true
  end
end
local restored, restored_amount = 0, 0
local out = {0}
for i = 3, #ARGV, 4 do
  local user, index, amount, at = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local seq = index + 1
  local current = redis.call('HGET', KEYS[3], user)
  if current then
    local held_seq = tonumber(string.match(current, '^(%d+):'))
    if held_seq ~= seq then
      out[#out + 1] = 'packet ' .. ARGV[1] .. ': ' .. user .. ' holds share ' .. index ..
        ' in the ledger, ' .. (held_seq - 1) .. ' in Redis'
    end
  else
    local free
    if closed then
      free = not held[seq]
    else
      local packed = string.format('%d', index * 4294967296 + amount)
      free = redis.call('LREM', KEYS[2], 1, packed) == 1
    end
    if free then
      held[seq] = true
      redis.call('HSET', KEYS[3], user, string.format('%d:%d:', seq, amount) .. at)
      restored, restored_amount = restored + 1, restored_amount + amount
    else
      out[#out + 1] = 'packet ' .. ARGV[1] .. ': share ' .. index .. ' of ' .. user ..
        ' was issued again by Redis after it lost data'
    end
  end
end
if restored > 0 then
  local left = tonumber(meta[3])
  redis.call('HINCRBY', KEYS[1], 'left', -restored_amount)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  if closed then
    local shares_left = tonumber(meta[4]) - restored
    redis.call('HSET', KEYS[1], 'nleft', shares_left)
    local refund = {'k', 'r', 'p', ARGV[1], 's', ARGV[2],
      'a', string.format('%d', left - restored_amount), 'n', shares_left, 't', closed}
    if meta[5] then
      refund[#refund + 1], refund[#refund + 2] = 'x', 'c'
    end
    redis.call('XADD', KEYS[4], '*', unpack(refund))
  end
end
out[1] = restored
return out

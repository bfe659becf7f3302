-- rate_limit.lua: a token bucket; take `cost` tokens if there are enough.
--
-- KEYS[1]  the bucket hash   hb:rl:<scope>:<subject>   (fields: tokens, ts)
-- ARGV[1]  refill rate, tokens per second (> 0)
-- ARGV[2]  capacity (burst), tokens
-- ARGV[3]  cost of this request, tokens
-- Returns {allowed (1 or 0), retry_after_ms (0 when allowed)}.
-- Time is this server's clock, so every API process shares one view of the bucket.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000)
end
local allowed, wait = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'ts', math.max(now, ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait}

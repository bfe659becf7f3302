-- ack.lua: acknowledge applied events and delete them, so the stream stays short.
--
-- KEYS[1]  a bucket's event stream
-- ARGV[1]  consumer group     ARGV[2 ..]  entry ids
-- Returns the number of entries acknowledged.

local CHUNK = 1000  -- unpack() has a stack limit: the ids go in slices
local acked = 0
for first = 2, #ARGV, CHUNK do
  local last = math.min(first + CHUNK - 1, #ARGV)
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, first, last))
  redis.call('XDEL', KEYS[1], unpack(ARGV, first, last))
end
return acked

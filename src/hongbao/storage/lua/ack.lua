-- ack.lua: acknowledge applied events and delete them, so the stream stays short.
--
-- KEYS[1]  a bucket's event stream
-- ARGV[1]  consumer group     ARGV[2 ..]  entry ids
-- Returns the number of entries acknowledged.

local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return acked

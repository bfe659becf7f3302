-- dead_letter.lua: park an entry the persister cannot apply, with the reason,
-- and take it off the event stream (it is never silently dropped).
--
-- KEYS[1]  a bucket's event stream     KEYS[2]  the bucket's dead-letter stream
-- ARGV[1]  consumer group     ARGV[2]  entry id     ARGV[3]  reason
-- ARGV[4 ..]  the entry's fields and values, flattened
-- Returns the id of the dead-letter entry.

local id = redis.call('XADD', KEYS[2], '*', 'reason', ARGV[3], 'id', ARGV[2],
  unpack(ARGV, 4))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id

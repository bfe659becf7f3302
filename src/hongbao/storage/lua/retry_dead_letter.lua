-- retry_dead_letter.lua: put a parked entry back on its bucket's event stream, for the
-- persister to apply again (the ledger applies an event once: a replay is a no-op), and
-- take it off the dead-letter stream. Atomic: the entry is on exactly one of the two.
--
-- KEYS[1]  the bucket's dead-letter stream     KEYS[2]  the bucket's event stream
-- ARGV[1]  the id of the entry on the dead-letter stream
-- Returns the id of the new event entry, or nil when the dead-letter stream has no such
-- entry; an error when the entry is not in the form dead_letter.lua writes.
-- A parked entry's fields are reason, id (both added by dead_letter.lua), then the
-- event's own fields: those go back, in their order.

local rows = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #rows == 0 then
  return nil
end
local fields = rows[1][2]
if fields[1] ~= 'reason' or fields[3] ~= 'id' or #fields < 6 then
  return redis.error_reply('dead-letter entry ' .. ARGV[1] .. ' is not a parked event')
end
local id = redis.call('XADD', KEYS[2], '*', unpack(fields, 5))
redis.call('XDEL', KEYS[1], ARGV[1])
return id

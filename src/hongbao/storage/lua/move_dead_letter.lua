-- move_dead_letter.lua: take a parked entry off its bucket's dead-letter stream, either
-- back onto the event stream, for the persister to apply again (the ledger applies an
-- event once: a replay is a no-op), or onto the resolved stream, with the operator's
-- note, never to be applied. Atomic: the entry is on exactly one stream throughout.
--
-- KEYS[1]  the bucket's dead-letter stream
-- KEYS[2]  where it goes: the bucket's event stream (retry) or resolved stream (resolve)
-- ARGV[1]  the id of the entry on the dead-letter stream
-- ARGV[2]  'retry' or 'resolve'
-- ARGV[3]  resolve: the operator's note
-- Returns the id of the new entry, or nil when the dead-letter stream has no such
-- entry; an error when the entry is not in the form dead_letter.lua writes.
-- A parked entry's fields are reason, id (both added by dead_letter.lua), then the
-- event's own fields. A retry writes back the event's own fields, in their order; a
-- resolve writes note, resolved_at (unix ms), then all of the parked entry's fields.

local rows = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #rows == 0 then
  return nil
end
local fields = rows[1][2]
if fields[1] ~= 'reason' or fields[3] ~= 'id' or #fields < 6 then
  return redis.error_reply('dead-letter entry ' .. ARGV[1] .. ' is not a parked event')
end
local id
if ARGV[2] == 'retry' then
  id = redis.call('XADD', KEYS[2], '*', unpack(fields, 5))
elseif ARGV[2] == 'resolve' then
  local t = redis.call('TIME')
  local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  id = redis.call('XADD', KEYS[2], '*', 'note', ARGV[3], 'resolved_at', now, unpack(fields))
else
  return redis.error_reply('unknown move ' .. tostring(ARGV[2]))
end
redis.call('XDEL', KEYS[1], ARGV[1])
return id

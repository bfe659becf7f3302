-- Seed 002 (利用redis + lua解决抢红包高并发的问题, 2016): tryGetHongBaoScript, as published.
-- Atomically: refuse a user already in the dedupe hash, else pop one small packet,
-- stamp the user id into its JSON, remember the user, and push it to the consumed list.
--
-- KEYS[1]  unconsumed list of small packets, JSON {"id": <int>, "money": <int>}
-- KEYS[2]  consumed list (LPUSH; a single persister drains it to the database)
-- KEYS[3]  dedupe hash: field = user id, value = user id
-- KEYS[4]  the user id (the seed passes it as a KEY, not an ARGV)
-- ARGV     none
-- Returns  nil when the user already grabbed or the list is empty;
--          otherwise the JSON of the packet with "userId" (a string) added.
if redis.call('hexists', KEYS[3], KEYS[4]) ~= 0 then
  return nil
else
  local hongBao = redis.call('rpop', KEYS[1]);
  if hongBao then
    local x = cjson.decode(hongBao);
    x['userId'] = KEYS[4];
    local re = cjson.encode(x);
    redis.call('hset', KEYS[3], KEYS[4], KEYS[4]);
    redis.call('lpush', KEYS[2], re);
    return re;
  end
end
return nil

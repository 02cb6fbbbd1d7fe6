-- Deduplicated enqueue of one delivery.
--
-- KEYS[1]  stream key        dt:{ns:queue}:stream (or :shadow)
-- KEYS[2]  dedup key         dt:{ns:queue}:dedup:<task_id>:<generation>:<delivery>
-- ARGV[1]  dedup TTL in milliseconds (>= 24 h)
-- ARGV[2..] field, value, field, value, ... of the stream entry
--
-- Returns the entry id: the existing one when this delivery was published before, else the
-- id XADD assigned.
--
-- Order matters. Scripts do not roll back: if anything fails after XADD, the worst outcome
-- is a duplicate entry, which the execution fence absorbs. Setting the dedup key first could
-- leave a key that blocks a delivery that never reached the stream.
local existing = redis.call('GET', KEYS[2])
if existing then
  return existing
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id

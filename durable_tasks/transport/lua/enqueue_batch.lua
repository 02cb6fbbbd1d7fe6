-- Deduplicated enqueue of a batch of entries to ONE stream: the dispatcher's publish, and the
-- DLQ's append (a batch of one).
--
-- KEYS[1]         stream key     dt:{ns:queue[:partition]}:stream (or :shadow)
-- KEYS[2..n+1]    dedup keys     dt:{ns:queue[:partition]}:dedup:<task_id>:<generation>:<delivery>
--                 (one per delivery; every key shares the stream's hash tag, so one slot)
-- ARGV[1]         dedup TTL in milliseconds (>= 24 h)
-- ARGV[2..n+1]    per delivery, beside its dedup key: its fields as ONE JSON array of strings
--                 ["field", "value", "field", "value", ...]. One argument per delivery, not
--                 one per string: the client packs every argument in Python, and that cost
--                 was the dispatcher's largest.
--
-- Returns n entry ids in order: the existing id when a delivery was published before, else
-- the id XADD assigned.
--
-- Per delivery, order matters: GET, then XADD, then SET. Scripts do not roll back: a failure
-- part-way leaves the earlier entries with their dedup keys, so the retry of the whole batch
-- adds nothing twice; at worst a duplicate entry, which the execution fence absorbs. Setting
-- the dedup key first could leave a key that blocks a delivery that never reached the stream.
local ttl = ARGV[1]
local ids = {}
for i = 2, #KEYS do
  local existing = redis.call('GET', KEYS[i])
  if existing then
    ids[i - 1] = existing
  else
    local id = redis.call('XADD', KEYS[1], '*', unpack(cjson.decode(ARGV[i])))
    redis.call('SET', KEYS[i], id, 'PX', ttl)
    ids[i - 1] = id
  end
end
return ids

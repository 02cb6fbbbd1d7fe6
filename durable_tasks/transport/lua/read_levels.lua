-- A prioritized read (durable_tasks.flow): XREADGROUP over the level streams of some queues,
-- highest level first, so a read takes what waits at a higher level before anything lower.
--
-- KEYS[1..n]   streams, highest level first (dt:{ns:queue[:partition]}:stream:p<level>, then
--              the level-0 stream dt:{ns:queue[:partition]}:stream); all in one slot on a cluster
-- ARGV[1]      consumer group
-- ARGV[2]      consumer name
-- ARGV[3]      how many entries to read in all
-- ARGV[4]      the starvation guard's reserve: how many of them are read lowest level first
--              (durable_tasks.flow.policy.guard_reserve)
--
-- Returns {reply, last}: reply has XREADGROUP's shape ({{stream, {{id, {field, value, ...}},
-- ...}}, ...}, a stream possibly twice: once per pass); when it read nothing, last holds each
-- stream's last entry id ('0-0' for an empty stream), from which a plain XREAD blocks until
-- one of them gets a new entry (transport/reads.py). Reads never block here.
local group, consumer = ARGV[1], ARGV[2]
local count, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}

local function take(stream, wanted)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', wanted, 'STREAMS', stream, '>')
  if not reply then
    return 0
  end
  out[#out + 1] = reply[1]
  return #reply[1][2]
end

local left = count - reserve
for i = 1, #KEYS do
  if left <= 0 then
    break
  end
  left = left - take(KEYS[i], left)
end
left = left + reserve
for i = #KEYS, 1, -1 do
  if left <= 0 then
    break
  end
  left = left - take(KEYS[i], left)
end
local last = {}
if #out == 0 then
  for i = 1, #KEYS do
    local tail = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    last[i] = tail[1] and tail[1][1] or '0-0'
  end
end
return {out, last}

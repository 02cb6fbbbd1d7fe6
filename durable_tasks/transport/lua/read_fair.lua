-- A read over several streams that takes at most ARGV[3] entries in all: XREADGROUP's COUNT
-- bounds each stream, not the read, and a worker reading several queues or partitions must
-- not start more attempts than it has slots for. Every stream gets an even share of what is
-- left; what a stream cannot fill goes to those that filled theirs.
--
-- KEYS[1..n]   streams (all in one slot on a cluster)
-- ARGV[1]      consumer group
-- ARGV[2]      consumer name
-- ARGV[3]      how many entries to read in all
--
-- Returns {reply, last}: reply has XREADGROUP's shape ({{stream, {{id, {field, value, ...}},
-- ...}}, ...}, a stream possibly more than once); when it read nothing, last holds each
-- stream's last entry id ('0-0' for an empty stream), from which a plain XREAD blocks until
-- one of them gets a new entry (transport/reads.py). Reads never block here.
local group, consumer, left = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
local active = KEYS
while left > 0 and #active > 0 do
  local share = math.max(1, math.floor(left / #active))
  local filled = {}
  for _, stream in ipairs(active) do
    local wanted = math.min(share, left)
    if wanted <= 0 then
      break
    end
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', wanted, 'STREAMS', stream, '>')
    local got = 0
    if reply then
      out[#out + 1] = reply[1]
      got = #reply[1][2]
    end
    left = left - got
    if got == wanted then
      filled[#filled + 1] = stream
    end
  end
  active = filled
end
local last = {}
if #out == 0 then
  for i = 1, #KEYS do
    local tail = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    last[i] = tail[1] and tail[1][1] or '0-0'
  end
end
return {out, last}

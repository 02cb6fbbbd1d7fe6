-- Keep concurrency slots (durable_tasks.flow, admit.lua) held while their attempts run: each
-- slot's expiry moves to the server's now + the lease, if the slot still exists.
--
-- KEYS[1..n]   slot sets dt:{ns:flow}:slots:<limit>:<key> (one tag: one cluster slot)
-- ARGV[1]      lease in ms
-- ARGV[2..n+1] the member held in each KEYS[i]
--
-- Returns how many slots were still held (a slot that expired meanwhile is not taken back).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local renewed = 0
for i = 1, #KEYS do
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i + 1]) == 1 then
    renewed = renewed + 1
  end
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 2)
end
return renewed

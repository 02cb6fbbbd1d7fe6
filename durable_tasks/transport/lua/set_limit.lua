-- Write a limit's run-time setting (durable_tasks.flow.control) only if nobody changed it since
-- it was read: a compare-and-set, so two overlapping set_limit calls that change different
-- values of one limit both hold (the one that lost reads again and merges its change).
--
-- KEYS[1]   the limits' run-time settings, a hash: limit name -> JSON (see admit.lua)
-- ARGV[1]   the limit's name (the hash field)
-- ARGV[2]   the setting as it was read, or '' when the field was absent
-- ARGV[3]   the new setting (JSON)
--
-- Returns 1 when written, 0 when the field no longer holds ARGV[2] (nothing written).
local current = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if current ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1

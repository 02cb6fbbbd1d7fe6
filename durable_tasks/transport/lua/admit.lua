-- Flow-control admission (durable_tasks.flow): rate limits (GCRA) and per-key concurrency
-- slots, checked for a batch of deliveries in one call, across every worker.
--
-- KEYS[1]        the limits' run-time settings, a hash: limit name -> JSON
--                {"interval_ms": <float>, "burst": <int>, "concurrency": <int>} (any subset);
--                a field present overrides the default the code passed for that limit
-- KEYS[2..n]     the state keys the checks name by index: a rate's theoretical arrival time
--                dt:{ns:flow}:tat:<limit> (a string, ms), or a concurrency key's slots
--                dt:{ns:flow}:slots:<limit>:<key> (a sorted set: member -> lease expiry, ms)
--                every key shares the hash tag {ns:flow}: one slot on a cluster
-- ARGV[1]        slot lease in ms: a slot frees itself this long after its last renewal
-- ARGV[2]        base wait in ms for a delivery refused by a busy concurrency key
-- ARGV[3]        JSON list of requests, one per delivery, in order:
--                {"m": member, "c": [[kind, key index, limit name, default interval_ms or
--                concurrency, default burst], ...]} with kind "r" (rate) or "c" (concurrency)
--
-- Returns one integer per request: 0 when admitted (the rate's TAT advanced, the slot taken),
-- else the ms to wait before trying again (nothing taken: a delivery is admitted by all of its
-- limits at once or by none).
--
-- GCRA: a limit of one admission per interval with a burst of b keeps one number, the
-- theoretical arrival time (TAT). A delivery at now is admitted when max(TAT, now) - now <=
-- (b - 1) * interval, and then TAT = max(TAT, now) + interval. Time is the server's (TIME),
-- so workers' clocks do not matter. Refused deliveries of one call get staggered waits (each
-- as if the ones before it had gone), so they come back spread at the limit's pace.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[1])
local busy_wait = tonumber(ARGV[2])
local requests = cjson.decode(ARGV[3])
local settings = {}
local virtual_tat = {}
local waiting = {}

local function setting(name)
  if settings[name] == nil then
    local raw = redis.call('HGET', KEYS[1], name)
    settings[name] = raw and cjson.decode(raw) or false
  end
  return settings[name]
end

local function tat_of(key)
  local stored = tonumber(redis.call('GET', key) or '0')
  return math.max(stored, now)
end

local out = {}
for r = 1, #requests do
  local request = requests[r]
  local wait = 0
  local takes = {}
  for _, check in ipairs(request.c) do
    local kind, key, name = check[1], KEYS[check[2]], check[3]
    local set = setting(name)
    if kind == 'r' then
      local interval = (set and set.interval_ms) or check[4]
      local burst = (set and set.burst) or check[5]
      local tat = tat_of(key)
      local over = tat - now - (burst - 1) * interval
      if over > 0 then
        local vt = math.max(virtual_tat[key] or tat, tat)
        wait = math.max(wait, vt - now - (burst - 1) * interval)
        takes[#takes + 1] = {'v', key, vt + interval}
      else
        takes[#takes + 1] = {'r', key, tat + interval}
      end
    else
      local limit = (set and set.concurrency) or check[4]
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      if not redis.call('ZSCORE', key, request.m) and redis.call('ZCARD', key) >= limit then
        waiting[key] = (waiting[key] or 0) + 1
        wait = math.max(wait, busy_wait * waiting[key])
      else
        takes[#takes + 1] = {'c', key}
      end
    end
  end
  if wait > 0 then
    for _, take in ipairs(takes) do
      if take[1] == 'v' then
        virtual_tat[take[2]] = take[3]
      end
    end
    out[r] = math.max(1, math.ceil(wait))
  else
    for _, take in ipairs(takes) do
      if take[1] == 'r' then
        redis.call('SET', take[2], tostring(take[3]), 'PX', math.ceil(take[3] - now) + 1000)
      else
        redis.call('ZADD', take[2], now + lease, request.m)
        redis.call('PEXPIRE', take[2], lease * 2)
      end
    end
    out[r] = 0
  end
end
return out

-- heartbeat.lua: a worker says it is alive and renews the leases of the jobs it still owns; it learns
-- which of them were cancelled (should the stop-job message have been missed) and which it lost.
-- KEYS[1] the worker's RQ hash
-- ARGV[1] the worker's incarnation   ARGV[2] TTL of the worker's hash (s)   ARGV[3] now (RQ timestamp)
-- ARGV[4] worker (RQ name)   ARGV[5] lease (ms)   ARGV[6..] id, attempt of each job the worker runs
-- Returns {1, cancelled ids, lost ids}, or {0, {}, {}} when another process has taken over the name.
if redis.call('hget', KEYS[1], 'gl_incarnation') ~= ARGV[1] then
  return {0, {}, {}}
end
redis.call('hset', KEYS[1], 'last_heartbeat', ARGV[3])
redis.call('expire', KEYS[1], ARGV[2])
local lease_until = now_ms() + tonumber(ARGV[5])
local cancelled, lost = {}, {}
for i = 6, #ARGV, 2 do
  local id = ARGV[i]
  local jobkey = key(K.job, id)
  if owns(jobkey, ARGV[4], ARGV[i + 1]) then
    redis.call('zadd', LEASES, 'XX', lease_until, id)
    if redis.call('hget', jobkey, 'gl_cancel') == '1' then
      cancelled[#cancelled + 1] = id
    end
  else
    lost[#lost + 1] = id
  end
end
return {1, cancelled, lost}

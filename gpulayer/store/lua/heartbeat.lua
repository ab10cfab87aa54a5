-- heartbeat.lua: a worker says it is alive, and learns which of its jobs were cancelled (in case the
-- stop-job message was missed while its connection was down).
-- KEYS[1] the worker's RQ hash   KEYS[2] the worker's set of jobs
-- ARGV[1] the worker's incarnation   ARGV[2] TTL of the worker's hash (s)   ARGV[3] now (RQ timestamp)
-- Returns {1, cancelled ids}, or {0, {}} when another process has taken over this worker's name.
if redis.call('hget', KEYS[1], 'gl_incarnation') ~= ARGV[1] then
  return {0, {}}
end
redis.call('hset', KEYS[1], 'last_heartbeat', ARGV[3])
redis.call('expire', KEYS[1], ARGV[2])
local cancelled = {}
for _, id in ipairs(redis.call('smembers', KEYS[2])) do
  if redis.call('hget', key(K.job, id), 'gl_cancel') == '1' then
    cancelled[#cancelled + 1] = id
  end
end
return {1, cancelled}

-- forget.lua: a job this worker ran was deleted through RQ (job.delete(), rq-dashboard's Delete) while
-- it held it: its hash, and with it the record of what it held, is gone, so nothing else frees that.
-- What it held on this worker is freed here: its place in the worker's jobs and leases, the GPUs whose
-- key still names it (of those the worker offers), and the worker's CPU slots and memory in use,
-- counted again from the jobs it still holds. Nothing is done while the job's hash exists (it was
-- taken over, and whoever did so freed what this attempt held).
-- KEYS[1] the job's hash   KEYS[2] the worker's RQ hash
-- ARGV[1] job id   ARGV[2] worker (RQ name)
-- Returns 1 if it freed the job's holdings, else 0.
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
local id, name = ARGV[1], display(ARGV[2])
local jobs = key(K.worker_jobs, name)
if redis.call('srem', jobs, id) == 0 then
  return 0
end
redis.call('zrem', LEASES, id)
local offer = decoded(redis.call('hget', KEYS[2], 'gl_offer'), {})
for _, gpu in ipairs(type(offer.gpus) == 'table' and offer.gpus or {}) do
  if type(gpu) == 'table' and type(gpu.uuid) == 'string' and redis.call('get', key(K.gpu, gpu.uuid)) == id then
    redis.call('del', key(K.gpu, gpu.uuid))
  end
end
local cpus, memory = 0, 0
for _, other in ipairs(redis.call('smembers', jobs)) do
  local v = redis.call('hmget', key(K.job, other), 'gl_cpus', 'gl_memory')
  cpus, memory = cpus + (tonumber(v[1]) or 0), memory + (tonumber(v[2]) or 0)
end
-- Whole numbers as digits: Lua prints large ones in exponent form, which HINCRBY would refuse later.
redis.call('hset', key(K.worker_usage, name), 'cpus', string.format('%d', cpus), 'memory',
  string.format('%.0f', memory))
show_next(ARGV[2], id)
return 1

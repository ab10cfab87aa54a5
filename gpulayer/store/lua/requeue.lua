-- requeue.lua: give back jobs a worker holds, to the front of their queues (a cold shutdown, or a
-- worker restarted under the same name). A job whose cancel was requested ends cancelled instead.
-- KEYS[1] the worker's set of jobs
-- ARGV[1] worker (RQ name)   ARGV[2] line for each job's log   ARGV[3] now (RQ timestamp)
-- ARGV[4..] job ids; none means every job in the set
-- Returns the number of jobs put back.
local ids = redis.call('smembers', KEYS[1])
if #ARGV > 3 then
  ids = {unpack(ARGV, 4)}
end
local requeued = 0
for _, id in ipairs(ids) do
  local jobkey = key(K.job, id)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name', 'gl_attempt', 'origin', 'gl_cancel')
  if (v[1] == 'scheduled' or v[1] == 'running') and v[2] == ARGV[1] then
    log_line(id, 'system', v[3], ARGV[2])
    if v[5] == '1' then
      redis.call('hset', jobkey, 'gl_reason', 'cancelled')
      end_job(id, jobkey, 'cancelled', ARGV[3])
    else
      redis.call('zrem', key(K.started, v[4]), id .. ':' .. v[3])
      release(id, jobkey)
      set_state(id, jobkey, 'queued')
      redis.call('hset', jobkey, 'worker_name', '')
      redis.call('lpush', key(K.queue, v[4]), id)
      redis.call('publish', key(K.wake, v[4]), v[4])
      requeued = requeued + 1
    end
  end
  redis.call('srem', KEYS[1], id)
end
return requeued

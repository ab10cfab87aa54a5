-- cancel.lua: cancel a job. A queued one ends here; a scheduled or running one is flagged and its
-- worker told (RQ's stop-job command), and the worker ends it once its processes are gone. A gang job
-- is told to every worker it runs on; it ends once all its parts have.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] now (RQ timestamp)
-- Returns 'cancelled', 'requested', 'ended' (it had already ended; nothing changes), or 'missing'.
local v = redis.call('hmget', KEYS[1], 'gl_state', 'origin', 'worker_name')
local state = v[1]
if not state then
  return 'missing'
end
if state == 'queued' then
  redis.call('lrem', key(K.queue, v[2]), 0, ARGV[1])
  redis.call('zrem', GANGS, ARGV[1])
  redis.call('hset', KEYS[1], 'gl_reason', 'cancelled while queued')
  end_job(ARGV[1], KEYS[1], 'cancelled', ARGV[2])
  return 'cancelled'
end
if state == 'scheduled' or state == 'running' then
  redis.call('hset', KEYS[1], 'gl_cancel', '1')
  if redis.call('hexists', KEYS[1], 'gl_parts') == 1 then
    stop_parts(KEYS[1], nil)
  else
    redis.call('publish', key(K.pubsub, v[3] or ''), cjson.encode({command = 'stop-job', job_id = ARGV[1]}))
  end
  return 'requested'
end
return 'ended'

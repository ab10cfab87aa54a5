-- claim.lua: take up to N queued jobs from a worker's queues, in the order given, in one atomic step:
-- popped from the queue and recorded as scheduled on this worker together, so no crash loses a job.
-- KEYS[1] rq:suspended   KEYS[2] the worker's set of jobs   KEYS[3..] queues, in the order to serve them
-- ARGV[1] N   ARGV[2] worker (RQ name)   ARGV[3] now (RQ timestamp)
-- Returns a flat list: id, attempt, spec JSON, queue name, for each claimed job.
-- Ids whose job is gone or no longer queued are dropped from the queue and skipped.
if redis.call('exists', KEYS[1]) == 1 then
  return {}
end
local want = tonumber(ARGV[1])
local out = {}
for i = 3, #KEYS do
  local origin = string.sub(KEYS[i], #K.queue[1] + 1)
  while want > 0 do
    local id = redis.call('lpop', KEYS[i])
    if not id then
      break
    end
    local jobkey = key(K.job, id)
    if redis.call('hget', jobkey, 'gl_state') == 'queued' then
      local attempt = redis.call('hincrby', jobkey, 'gl_attempt', 1)
      set_state(id, jobkey, 'scheduled')
      redis.call('hset', jobkey, 'worker_name', ARGV[2], 'gl_scheduled_at', ARGV[3])
      redis.call('sadd', KEYS[2], id)
      redis.call('zadd', key(K.started, origin), '+inf', id .. ':' .. attempt)
      out[#out + 1] = id
      out[#out + 1] = attempt
      out[#out + 1] = redis.call('hget', jobkey, 'gl_spec')
      out[#out + 1] = origin
      want = want - 1
    end
  end
end
return out

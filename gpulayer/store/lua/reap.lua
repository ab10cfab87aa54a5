-- reap.lua: every worker runs it; being one script, each expired lease is acted on exactly once.
-- A job whose lease expired lost its worker: it runs again or fails ("worker lost"). A retry whose
-- back-off has passed goes back to the front of its queue. A failed gang job that RQ's requeue put
-- back in a queue no worker serves (no other job ever used it) is taken up (take_requeue).
-- ARGV[1] how many of each to handle at most   ARGV[2] now (RQ timestamp)
-- Returns the number of jobs handled.
local now = now_ms()
local handled = 0
for _, id in ipairs(redis.call('zrangebyscore', LEASES, '-inf', now, 'LIMIT', 0, ARGV[1])) do
  local jobkey = key(K.job, id)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name')
  if (v[1] == 'scheduled' or v[1] == 'running') and v[2] then
    lose(id, jobkey, 'worker ' .. display(v[2]) .. ' stopped renewing its lease', ARGV[2])
  end
  redis.call('zrem', LEASES, id)
  handled = handled + 1
end
for _, id in ipairs(redis.call('zrangebyscore', DELAYED, '-inf', now, 'LIMIT', 0, ARGV[1])) do
  local jobkey = key(K.job, id)
  redis.call('zrem', DELAYED, id)
  if redis.call('hget', jobkey, 'gl_state') == 'queued' then
    redis.call('hdel', jobkey, 'gl_retry_at')
    enqueue(id, jobkey)
  end
  handled = handled + 1
end
for _, name in ipairs(redis.call('smembers', GANG_ORIGINS)) do
  if redis.call('hexists', QUEUES, name) == 1 then
    -- Served now: the claim finds what RQ puts there, among the queue's other jobs.
    redis.call('srem', GANG_ORIGINS, name)
  else
    -- Nothing else goes in such a queue: what is not a requeued job is dropped, as a claim would.
    for _, id in ipairs(redis.call('lpop', key(K.queue, name), ARGV[1]) or {}) do
      local jobkey = key(K.job, id)
      local state = redis.call('hget', jobkey, 'gl_state')
      if requeued_by_rq(jobkey, state) then
        take_requeue(id, jobkey, state)
      end
      handled = handled + 1
    end
  end
end
return handled

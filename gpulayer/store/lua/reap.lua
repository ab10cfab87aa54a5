-- reap.lua: every worker runs it; being one script, each expired lease is acted on exactly once.
-- A job whose lease expired lost its worker: it runs again or fails ("worker lost"). A retry whose
-- back-off has passed goes back to the front of its queue. A failed gang job that RQ's requeue put
-- back in a queue no worker serves (no other job ever used it) is taken up (take_requeue). A queued
-- job a plain `rq worker` took (TAKEN_BY_RQ: it cannot run one, and says so) goes back to the front of
-- its queue once RQ's worker is done with it, RQ's records of that failure undone.
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
for _, id in ipairs(redis.call('srandmember', TAKEN_BY_RQ, ARGV[1])) do
  local jobkey = key(K.job, id)
  local v = redis.call('hmget', jobkey, 'gl_state', 'status', 'origin', 'gl_attempt', 'gl_taken_by_rq')
  if v[1] ~= 'queued' then
    redis.call('srem', TAKEN_BY_RQ, id)
  elseif v[2] ~= RQ_STATUS.running then
    -- RQ's worker failed it (its status is no longer started): undo that, and queue it again.
    redis.call('srem', TAKEN_BY_RQ, id)
    redis.call('zrem', key(K.failed, v[3] or ''), id)
    redis.call('del', key(K.results, id))
    redis.call('hdel', jobkey, 'exc_info', 'gl_taken_by_rq', 'ended_at')
    redis.call('persist', jobkey)
    log_line(id, 'system', v[4] or '0', 'taken by ' .. (v[5] or 'a plain rq worker') ..
      ', which cannot run a GPUlayer job: back in its queue')
    set_state(id, jobkey, 'queued')
    enqueue(id, jobkey)
  end
  handled = handled + 1
end
return handled

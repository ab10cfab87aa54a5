-- Shared by every script: the loader puts the prelude (K, JOBS, QUEUES, NEW_QUEUE, PREFIX, RQ_QUEUES,
-- RQ_STATUS, LOG_MAX_LINES, RETENTION; see gpulayer/store/scripts.py) and then this file before each script.
-- Keys of jobs named only by id are built here with key(); the scripts run on one Redis, not a cluster.

local function key(template, value)
  return template[1] .. value .. template[2]
end

-- Moves a job to a state: its gl_state, its RQ status, and the per-state index.
local function set_state(id, jobkey, state)
  local old = redis.call('hget', jobkey, 'gl_state')
  if old then
    redis.call('zrem', key(K.jobs_in, old), id)
  end
  local score = redis.call('zscore', JOBS, id)
  if score then
    redis.call('zadd', key(K.jobs_in, state), score, id)
  end
  redis.call('hset', jobkey, 'gl_state', state, 'status', RQ_STATUS[state])
end

-- True while this worker's attempt still owns the job: the fencing check before any write of a worker.
local function owns(jobkey, worker, attempt)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name', 'gl_attempt')
  return (v[1] == 'scheduled' or v[1] == 'running') and v[2] == worker and v[3] == attempt
end

local function log_line(id, stream, attempt, text)
  redis.call('xadd', key(K.logs, id), 'MAXLEN', LOG_MAX_LINES, '*', 's', stream, 'a', attempt, 'l', text)
end

-- Gives back what a job holds on its worker: its GPUs (only those it still holds) and its CPU slots
-- and memory. Called once per claim: the fields are cleared so a second call does nothing.
local function release(id, jobkey)
  local v = redis.call('hmget', jobkey, 'gl_gpu_uuids', 'gl_cpus', 'gl_memory', 'worker_name')
  for uuid in string.gmatch(v[1] or '', '[^,]+') do
    if redis.call('get', key(K.gpu, uuid)) == id then
      redis.call('del', key(K.gpu, uuid))
    end
  end
  if v[4] and v[4] ~= '' then
    local usage = key(K.worker_usage, string.sub(v[4], #PREFIX + 1))
    -- Amounts stay strings: Lua numbers print large values in exponent form, which HINCRBY refuses.
    for field, amount in pairs({cpus = v[2], memory = v[3]}) do
      if amount and amount ~= '0' then
        redis.call('hincrby', usage, field, '-' .. amount)
      end
    end
  end
  redis.call('hdel', jobkey, 'gl_gpu_uuids', 'gl_cpus', 'gl_memory')
end

-- Ends a job in a terminal state: RQ's registries, the done stream waiters block on, and retention
-- (the submitter's, kept in RQ's result_ttl field).
local function end_job(id, jobkey, state, ended_at)
  local v = redis.call('hmget', jobkey, 'origin', 'gl_attempt', 'result_ttl')
  local retention = tonumber(v[3]) or RETENTION
  release(id, jobkey)
  set_state(id, jobkey, state)
  redis.call('hset', jobkey, 'ended_at', ended_at)
  redis.call('zrem', key(K.started, v[1]), id .. ':' .. (v[2] or '0'))
  local now = tonumber(redis.call('time')[1])
  redis.call('zadd', key(K[RQ_STATUS[state]], v[1]), now + retention, id)
  redis.call('xadd', key(K.done, id), '*', 'state', state)
  redis.call('del', key(K.inputs, id))
  for _, k in ipairs({jobkey, key(K.logs, id), key(K.done, id), key(K.outputs, id)}) do
    redis.call('expire', k, retention)
  end
end

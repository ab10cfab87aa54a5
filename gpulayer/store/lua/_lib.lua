-- Shared by every script: the loader puts the prelude (K, JOBS, QUEUES, LEASES, DELAYED, NEW_QUEUE,
-- PREFIX, RQ_QUEUES, RQ_STATUS, LOG_MAX_LINES, RETENTION; see gpulayer/store/scripts.py) and then this
-- file before each script. Keys of jobs named only by id are built here with key(); the scripts run
-- on one Redis, not a cluster. Times of leases and back-offs are Redis's own (TIME), never a client's.

local function key(template, value)
  return template[1] .. value .. template[2]
end

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A worker's name as people know it, from the name RQ knows it by.
local function display(rq_name)
  return string.sub(rq_name, #PREFIX + 1)
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

-- Adds how the current attempt ended to the job's history (gl_attempts, a JSON list).
local function record_attempt(jobkey, outcome, exit_code, reason, ended_at)
  local v = redis.call('hmget', jobkey, 'gl_attempt', 'worker_name', 'started_at', 'gl_attempts')
  local attempts = v[4] and cjson.decode(v[4]) or {}
  attempts[#attempts + 1] = {
    attempt = tonumber(v[1]) or 0,
    worker = (v[2] and v[2] ~= '') and display(v[2]) or cjson.null,
    outcome = outcome,
    exit_code = tonumber(exit_code) or cjson.null,
    reason = reason or cjson.null,
    started_at = (v[3] and v[3] ~= '') and v[3] or cjson.null,
    ended_at = ended_at,
  }
  redis.call('hset', jobkey, 'gl_attempts', cjson.encode(attempts))
end

-- Gives back what a job holds on its worker: its GPUs (only those it still holds), its CPU slots and
-- memory, and its lease. The reservation fields are cleared, so giving back twice does nothing.
local function release(id, jobkey)
  local v = redis.call('hmget', jobkey, 'gl_gpu_uuids', 'gl_cpus', 'gl_memory', 'worker_name')
  for uuid in string.gmatch(v[1] or '', '[^,]+') do
    if redis.call('get', key(K.gpu, uuid)) == id then
      redis.call('del', key(K.gpu, uuid))
    end
  end
  if v[4] and v[4] ~= '' then
    local usage = key(K.worker_usage, display(v[4]))
    -- Amounts stay strings: Lua numbers print large values in exponent form, which HINCRBY refuses.
    for field, amount in pairs({cpus = v[2], memory = v[3]}) do
      if amount and amount ~= '0' then
        redis.call('hincrby', usage, field, '-' .. amount)
      end
    end
  end
  redis.call('hdel', jobkey, 'gl_gpu_uuids', 'gl_cpus', 'gl_memory')
  redis.call('zrem', LEASES, id)
end

-- Takes a job off the worker that holds it: RQ's started registry, the worker's set, what it holds.
local function detach(id, jobkey)
  local v = redis.call('hmget', jobkey, 'origin', 'gl_attempt', 'worker_name')
  redis.call('zrem', key(K.started, v[1]), id .. ':' .. (v[2] or '0'))
  if v[3] and v[3] ~= '' then
    redis.call('srem', key(K.worker_jobs, display(v[3])), id)
  end
  release(id, jobkey)
end

-- Puts a detached job back in its queue: at its front now, or once a back-off has passed (DELAYED).
local function back_to_queue(id, jobkey, delay_ms)
  local origin = redis.call('hget', jobkey, 'origin')
  set_state(id, jobkey, 'queued')
  redis.call('hset', jobkey, 'worker_name', '', 'started_at', '')
  redis.call('hdel', jobkey, 'gl_exit_code', 'gl_reason', 'gl_cancel')
  if delay_ms > 0 then
    local at = now_ms() + delay_ms
    redis.call('zadd', DELAYED, at, id)
    redis.call('hset', jobkey, 'gl_retry_at', at)
  else
    redis.call('lpush', key(K.queue, origin), id)
    redis.call('publish', key(K.wake, origin), id)
  end
end

-- If the job has a retry left for this kind of failure ('lost' or 'exit'), uses it and returns its
-- back-off in ms (the base delay, doubled for each retry before it); else nil.
local function use_retry(jobkey, kind)
  local v = redis.call('hmget', jobkey, 'gl_retries', 'gl_retry_on', 'gl_retry_delay', 'gl_retried')
  local retries, on, used = tonumber(v[1]) or 0, v[2] or 'lost', tonumber(v[4]) or 0
  if used >= retries or (on ~= 'both' and on ~= kind) then
    return nil
  end
  redis.call('hincrby', jobkey, 'gl_retried', 1)
  return math.floor((tonumber(v[3]) or 0) * 1000 * 2 ^ used)
end

-- Ends a job in a terminal state: off its worker, RQ's registries, the done stream waiters block on
-- (and its batch's list of ended jobs), and retention (the submitter's, kept in RQ's result_ttl field).
local function end_job(id, jobkey, state, ended_at)
  local v = redis.call('hmget', jobkey, 'origin', 'result_ttl', 'gl_idempotency', 'gl_batch')
  local retention = tonumber(v[2]) or RETENTION
  if v[4] then
    local ended = key(K.ended, v[4])
    redis.call('rpush', ended, id)
    redis.call('expire', ended, retention)
  end
  detach(id, jobkey)
  redis.call('zrem', DELAYED, id)
  set_state(id, jobkey, state)
  redis.call('hset', jobkey, 'ended_at', ended_at)
  redis.call('zadd', key(K[RQ_STATUS[state]], v[1]), math.floor(now_ms() / 1000) + retention, id)
  redis.call('xadd', key(K.done, id), '*', 'state', state)
  redis.call('del', key(K.inputs, id))
  for _, k in ipairs({jobkey, key(K.logs, id), key(K.done, id), key(K.outputs, id), v[3]}) do
    if k then
      redis.call('expire', k, retention)
    end
  end
end

-- A job whose worker is gone (its lease expired, or the worker restarted under its name): run again
-- if it has a retry left for a lost worker, else failed with reason "worker lost". Returns what
-- became of it: 'requeued', 'failed' or 'cancelled'.
local function lose(id, jobkey, reason, now_text)
  local attempt = redis.call('hget', jobkey, 'gl_attempt')
  record_attempt(jobkey, 'lost', nil, reason, now_text)
  log_line(id, 'system', attempt, reason)
  if redis.call('hget', jobkey, 'gl_cancel') == '1' then
    redis.call('hset', jobkey, 'gl_reason', 'cancelled')
    end_job(id, jobkey, 'cancelled', now_text)
    return 'cancelled'
  end
  local delay = use_retry(jobkey, 'lost')
  detach(id, jobkey)
  if delay then
    back_to_queue(id, jobkey, delay)
    return 'requeued'
  end
  redis.call('hset', jobkey, 'gl_reason', 'worker lost')
  end_job(id, jobkey, 'failed', now_text)
  return 'failed'
end

-- Shared by every script: the loader puts the prelude (K, JOBS, QUEUES, LEASES, DELAYED, GANGS,
-- GANG_WAKE, GANG_START_TRIES, NEW_QUEUE, PREFIX, RQ_QUEUES, RQ_STATUS, LOG_MAX_LINES, RETENTION,
-- EVENTS, START_LATENCY, START_BUCKETS, RUN_TIME, RUN_BUCKETS, ENDED_COUNTS, FINAL; see
-- gpulayer/store/scripts.py) and then this
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

-- JSON a record holds, or ``default`` when it is missing or garbled: records can be written by
-- anything that reaches Redis, and a script must not fail, losing what it was doing, on one of them.
local function decoded(text, default)
  if not text then
    return default
  end
  local ok, value = pcall(cjson.decode, text)
  if ok and type(value) == 'table' then
    return value
  end
  return default
end

-- HINCRBY that counts a garbled field as 0 (a counter is rewritten, never an error); the new value.
local function add(jobkey, field, by)
  local value = math.floor(tonumber(redis.call('hget', jobkey, field)) or 0) + by
  redis.call('hset', jobkey, field, value)
  return value
end

-- Adds one observation (ms) to a histogram hash: a count in the first bucket it fits, 'sum' and 'count'.
local function observe(hist, bounds, ms)
  local bucket = #bounds
  for i, bound in ipairs(bounds) do
    if ms <= bound then
      bucket = i - 1
      break
    end
  end
  redis.call('hincrby', hist, bucket, 1)
  redis.call('hincrby', hist, 'sum', ms)
  redis.call('hincrby', hist, 'count', 1)
end

-- Moves a job to a state: its gl_state, its RQ status, and the per-state index; for a job users know
-- (not a part of a gang job), times how long it waited to start and how long it ran, and tells the
-- dashboard (EVENTS).
local function set_state(id, jobkey, state)
  local v = redis.call('hmget', jobkey, 'gl_state', 'gl_parent', 'gl_queued_ms', 'gl_running_ms')
  local old = v[1]
  if old then
    redis.call('zrem', key(K.jobs_in, old), id)
  end
  local score = redis.call('zscore', JOBS, id)
  if score then
    redis.call('zadd', key(K.jobs_in, state), score, id)
  end
  redis.call('hset', jobkey, 'gl_state', state, 'status', RQ_STATUS[state])
  if v[2] then
    return
  end
  -- Redis's clock is read only by the changes that are timed.
  if state == 'queued' then
    redis.call('hset', jobkey, 'gl_queued_ms', now_ms())
  elseif state == 'running' then
    local now = now_ms()
    redis.call('hset', jobkey, 'gl_running_ms', now)
    if tonumber(v[3]) then
      observe(START_LATENCY, START_BUCKETS, now - tonumber(v[3]))
    end
  elseif old == 'running' and tonumber(v[4]) then
    observe(RUN_TIME, RUN_BUCKETS, now_ms() - tonumber(v[4]))
  end
  if FINAL[state] then
    redis.call('hincrby', ENDED_COUNTS, state, 1)
  end
  redis.call('publish', EVENTS, cjson.encode({type = 'job', id = id, state = state}))
end

-- True while this worker's attempt still owns the job: the fencing check before any write of a worker.
local function owns(jobkey, worker, attempt)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name', 'gl_attempt')
  return (v[1] == 'scheduled' or v[1] == 'running') and v[2] == worker and v[3] == attempt
end

-- A line of a job's log; ``rank``, for a line of one rank of a gang job, is its global rank.
local function log_line(id, stream, attempt, text, rank)
  if rank and rank ~= '' then
    redis.call('xadd', key(K.logs, id), 'MAXLEN', LOG_MAX_LINES, '*', 's', stream, 'a', attempt, 'l', text,
      'r', rank)
  else
    redis.call('xadd', key(K.logs, id), 'MAXLEN', LOG_MAX_LINES, '*', 's', stream, 'a', attempt, 'l', text)
  end
end

-- Adds how the current attempt ended to the job's history (gl_attempts, a JSON list).
local function record_attempt(jobkey, outcome, exit_code, reason, ended_at)
  local v = redis.call('hmget', jobkey, 'gl_attempt', 'worker_name', 'started_at', 'gl_attempts')
  local attempts = decoded(v[4], {})
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
      if amount and string.match(amount, '^%d+$') and amount ~= '0' then
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
  redis.call('zrem', key(K.started, v[1] or ''), id .. ':' .. (v[2] or '0'))
  if v[3] and v[3] ~= '' then
    redis.call('srem', key(K.worker_jobs, display(v[3])), id)
  end
  release(id, jobkey)
end

-- Puts a queued job where workers take it from, and wakes them: a gang job (gl_nodes) among the
-- waiting gangs, in the order of its creation; any other at the front of its queue.
local function enqueue(id, jobkey)
  local v = redis.call('hmget', jobkey, 'origin', 'gl_nodes')
  if v[2] then
    redis.call('zadd', GANGS, redis.call('zscore', JOBS, id) or 0, id)
    redis.call('publish', GANG_WAKE, id)
  else
    redis.call('lpush', key(K.queue, v[1] or ''), id)
    redis.call('publish', key(K.wake, v[1] or ''), id)
  end
end

-- Puts a detached job back in its queue: at its front now, or once a back-off has passed (DELAYED).
local function back_to_queue(id, jobkey, delay_ms)
  set_state(id, jobkey, 'queued')
  redis.call('hset', jobkey, 'worker_name', '', 'started_at', '')
  redis.call('hdel', jobkey, 'gl_exit_code', 'gl_reason', 'gl_cancel')
  if delay_ms > 0 then
    local at = now_ms() + delay_ms
    redis.call('zadd', DELAYED, at, id)
    redis.call('hset', jobkey, 'gl_retry_at', at)
  else
    enqueue(id, jobkey)
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
  add(jobkey, 'gl_retried', 1)
  return math.floor((tonumber(v[3]) or 0) * 1000 * 2 ^ used)
end

-- Ends a job in a terminal state: off its worker, RQ's registries, the done stream waiters block on
-- (and its batch's list of ended jobs), and retention (the submitter's, kept in RQ's result_ttl field).
local function end_job(id, jobkey, state, ended_at)
  local v = redis.call('hmget', jobkey, 'origin', 'result_ttl', 'gl_idempotency', 'gl_batch')
  local retention = tonumber(v[2]) or RETENTION
  -- Only a key of the kind it should name: a garbled field must not set a TTL on any other key.
  if v[3] and string.sub(v[3], 1, #K.idempotency[1]) ~= K.idempotency[1] then
    v[3] = nil
  end
  if v[4] then
    local ended = key(K.ended, v[4])
    redis.call('rpush', ended, id)
    redis.call('expire', ended, retention)
  end
  detach(id, jobkey)
  redis.call('zrem', DELAYED, id)
  redis.call('zrem', GANGS, id)
  set_state(id, jobkey, state)
  redis.call('hset', jobkey, 'ended_at', ended_at)
  redis.call('zadd', key(K[RQ_STATUS[state]], v[1] or ''), math.floor(now_ms() / 1000) + retention, id)
  redis.call('xadd', key(K.done, id), '*', 'state', state)
  redis.call('del', key(K.inputs, id), key(K.checkpoint, id))
  for _, k in ipairs({jobkey, key(K.logs, id), key(K.done, id), key(K.outputs, id), v[3]}) do
    if k then
      redis.call('expire', k, retention)
    end
  end
end

-- Asks the worker of every part of a gang job still scheduled or running to stop it (all but ``except``).
local function stop_parts(jobkey, except)
  for _, part in ipairs(decoded(redis.call('hget', jobkey, 'gl_parts'), {})) do
    local partkey = key(K.job, part.id)
    local v = redis.call('hmget', partkey, 'gl_state', 'worker_name')
    if part.id ~= except and (v[1] == 'scheduled' or v[1] == 'running') then
      redis.call('hset', partkey, 'gl_cancel', '1')
      redis.call('publish', key(K.pubsub, v[2]), cjson.encode({command = 'stop-job', job_id = part.id}))
    end
  end
end

-- Once every part of a gang job has ended, how the job ends: cancelled (if asked); back to wait
-- for workers if it never got going (a part could not start, its worker vanished first, or it was
-- given back); a lost worker (retried as one); the first part that failed (retried on a non-zero
-- exit as the job allows); or succeeded.
local function gang_ends(id, jobkey, now_text)
  local v = redis.call('hmget', jobkey, 'gl_cancel', 'gl_failure', 'started_at', 'gl_attempt')
  local failure = decoded(v[2], nil)
  local function finish(state, outcome, exit_code, reason)
    record_attempt(jobkey, outcome, exit_code, reason, now_text)
    if exit_code then
      redis.call('hset', jobkey, 'gl_exit_code', exit_code)
    end
    if reason then
      redis.call('hset', jobkey, 'gl_reason', reason)
    end
    end_job(id, jobkey, state, now_text)
  end
  if v[1] == '1' or (failure and failure.outcome == 'cancelled') then
    return finish('cancelled', 'cancelled', nil, 'cancelled')
  end
  if not failure then
    return finish('succeeded', 'succeeded', 0, nil)
  end
  local lost = redis.call('hget', jobkey, 'gl_lost')
  local started = v[3] and v[3] ~= ''
  if failure.outcome == 'returned' or failure.outcome == 'unstarted' or (lost and not started) then
    local reason = lost and not started and lost or failure.reason
    local tries = failure.outcome == 'returned' and 0 or add(jobkey, 'gl_start_failures', 1)
    if tries >= GANG_START_TRIES then
      return finish('failed', 'failed', nil, 'could not start ' .. tries .. ' times: ' .. reason)
    end
    record_attempt(jobkey, failure.outcome == 'returned' and 'returned' or 'unstarted', nil, reason, now_text)
    log_line(id, 'system', v[4], 'the job goes back to wait for workers: ' .. reason)
    detach(id, jobkey)
    return back_to_queue(id, jobkey, 0)
  end
  if lost then
    record_attempt(jobkey, 'lost', nil, lost, now_text)
    local delay = use_retry(jobkey, 'lost')
    if delay then
      detach(id, jobkey)
      return back_to_queue(id, jobkey, delay)
    end
    redis.call('hset', jobkey, 'gl_reason', 'worker lost: ' .. lost)
    return end_job(id, jobkey, 'failed', now_text)
  end
  local code = tonumber(failure.exit_code)
  if failure.outcome == 'failed' and code and code ~= 0 then
    local delay = use_retry(jobkey, 'exit')
    if delay then
      record_attempt(jobkey, 'failed', code, failure.reason, now_text)
      log_line(id, 'system', v[4], failure.reason .. '; retrying in ' .. (delay / 1000) .. ' s')
      detach(id, jobkey)
      return back_to_queue(id, jobkey, delay)
    end
  end
  return finish(failure.outcome, failure.outcome, code, failure.reason)
end

-- One part of a gang job (one worker's ranks) ended: 'succeeded', 'failed', 'timed_out',
-- 'cancelled', 'lost', 'returned' or 'unstarted'. Its worker's resources are free at once. The first
-- part that did not succeed stops all the others (fail-fast); the last part to end ends the job.
local function part_ends(part, partkey, outcome, exit_code, reason, now_text)
  local v = redis.call('hmget', partkey, 'gl_parent', 'gl_attempt', 'worker_name')
  detach(part, partkey)
  redis.call('hset', partkey, 'gl_state', outcome)
  redis.call('expire', partkey, RETENTION)
  local id = v[1]
  local jobkey = key(K.job, id)
  local p = redis.call('hmget', jobkey, 'gl_state', 'gl_attempt')
  if (p[1] ~= 'scheduled' and p[1] ~= 'running') or p[2] ~= v[2] then
    return
  end
  if outcome ~= 'succeeded' then
    local where = reason and reason ~= '' and reason or outcome
    if outcome == 'lost' or outcome == 'returned' then
      -- Said by the reaper or a worker's restart or shutdown, not by the part's runner.
      log_line(id, 'system', v[2], where)
    else
      where = where .. ' on ' .. display(v[3])
    end
    if outcome == 'lost' and not redis.call('hget', jobkey, 'gl_lost') then
      redis.call('hset', jobkey, 'gl_lost', where)
    end
    if not redis.call('hget', jobkey, 'gl_failure') then
      local failure = {outcome = outcome, exit_code = tonumber(exit_code) or cjson.null, reason = where}
      redis.call('hset', jobkey, 'gl_failure', cjson.encode(failure))
      stop_parts(jobkey, part)
    end
  end
  if add(jobkey, 'gl_left', -1) <= 0 then
    gang_ends(id, jobkey, now_text)
  end
end

-- A job whose worker is gone (its lease expired, or the worker restarted under its name): run again
-- if it has a retry left for a lost worker, else failed with reason "worker lost". Returns what
-- became of it: 'requeued', 'failed' or 'cancelled' ('part' for a part of a gang job).
local function lose(id, jobkey, reason, now_text)
  if redis.call('hexists', jobkey, 'gl_parent') == 1 then
    part_ends(id, jobkey, 'lost', nil, reason, now_text)
    return 'part'
  end
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

-- Why a job's record cannot be run as it stands (a field a worker needs is missing or garbled), or
-- nil when it can.
local function unsound(jobkey)
  local v = redis.call('hmget', jobkey, 'gl_attempt', 'gl_spec', 'origin', 'gl_nodes')
  if not v[1] or not string.match(v[1], '^%d+$') then
    return 'gl_attempt is not a whole number'
  end
  if not v[2] then
    return 'it has no gl_spec'
  end
  if not v[3] then
    return 'it has no origin'
  end
  if v[4] and not string.match(v[4], '^[1-9]%d*$') then
    return 'gl_nodes is not a whole number'
  end
  return nil
end

-- Fails a job whose record cannot be run, saying why: it is neither lost nor run.
local function spoil(id, jobkey, why, now_text)
  redis.call('hset', jobkey, 'gl_reason', 'corrupt record: ' .. why)
  end_job(id, jobkey, 'failed', now_text)
end

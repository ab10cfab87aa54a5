-- Shared by every script: the loader puts the prelude (K, JOBS, QUEUES, LEASES, DELAYED, GANGS,
-- GANG_WAKE, GANG_ORIGINS, TAKEN_BY_RQ, UNSIGNED, GANG_START_TRIES, NEW_QUEUE, PREFIX, RQ_QUEUES, RQ_WORKERS, RQ_STATUS,
-- EVENTS, START_LATENCY, START_BUCKETS, RUN_TIME, RUN_BUCKETS, ENDED_COUNTS, FINAL, WORKER_LOST; see
-- gpulayer/store/scripts.py) and then this file before the scripts: on Redis 7 once, before the
-- library's functions (one per script), on 6.2 before each script. Either way each script starts
-- with begin(ARGV). Keys of jobs named only by id are built here with key(); the scripts run on one
-- Redis, not a cluster. Times of leases and back-offs are Redis's own (TIME), never a client's.

local function key(template, value)
  return template[1] .. value .. template[2]
end

-- Each call's own: the clock, read once (a call is atomic, and each TIME is a command of its own),
-- and the caller's settings, which come last among its arguments: the library is one for every
-- caller, whatever their log cap and retention.
local now_read, LOG_MAX_LINES, RETENTION = nil, nil, nil
local function now_ms()
  if not now_read then
    local t = redis.call('time')
    now_read = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_read
end

-- Takes the caller's settings off the end of ARGV, so a script reads its own arguments only.
local function begin(argv)
  now_read = nil
  RETENTION = tonumber(table.remove(argv))
  LOG_MAX_LINES = tonumber(table.remove(argv))
end

-- Whether the field, value pairs of ``list`` from index ``first`` on set the field ``name``: what a
-- submit reads of the hash it writes without asking Redis.
local function sets_field(list, first, name)
  for i = first, #list, 2 do
    if list[i] == name then
      return true
    end
  end
  return false
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

-- How many of a job's last log lines RQ's tools see with a failure, and how long each may be (bytes).
local RQ_LOG_LINES, RQ_LINE_MAX = 10, 300
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'

-- At most ``max`` bytes of ``text``, never cutting a UTF-8 character in two: RQ's readers decode
-- what they read strictly, and one broken character would fail the whole page that shows it.
local function cut(text, max)
  if #text <= max then
    return text
  end
  local stop = max
  while stop > 0 and string.byte(text, stop + 1) >= 128 and string.byte(text, stop + 1) < 192 do
    stop = stop - 1
  end
  return string.sub(text, 1, stop) .. '...'
end

-- ``text`` in zlib's format (RFC 1950) made of deflate's stored blocks (RFC 1951): what RQ's readers
-- take (zlib.decompress). Redis's Lua has no compressor, and a few lines need none.
local function zlib_stored(text)
  local a, b = 1, 0
  for i = 1, #text do
    a = (a + string.byte(text, i)) % 65521
    b = (b + a) % 65521
  end
  local out = {'\120\1'}
  local at = 1
  repeat
    local n = math.min(#text - at + 1, 65535)
    local last = (at + n > #text) and 1 or 0
    out[#out + 1] = string.char(last, n % 256, math.floor(n / 256), 255 - n % 256, 255 - math.floor(n / 256))
    out[#out + 1] = string.sub(text, at, at + n - 1)
    at = at + n
  until at > #text
  out[#out + 1] = string.char(math.floor(b / 256), b % 256, math.floor(a / 256), a % 256)
  return table.concat(out)
end

local function base64(data)
  local out = {}
  for i = 1, #data, 3 do
    local x, y, z = string.byte(data, i, i + 2)
    local n = x * 65536 + (y or 0) * 256 + (z or 0)
    local c = {math.floor(n / 262144), math.floor(n / 4096) % 64, math.floor(n / 64) % 64, n % 64}
    for j = 1, 4 do
      c[j] = string.sub(B64, c[j] + 1, c[j] + 1)
    end
    out[#out + 1] = c[1] .. c[2] .. (y and c[3] or '=') .. (z and c[4] or '=')
  end
  return table.concat(out)
end

-- HINCRBY that counts a garbled field as 0 (a counter is rewritten, never an error); the new value.
local function add(jobkey, field, by)
  local value = math.floor(tonumber(redis.call('hget', jobkey, field)) or 0) + by
  redis.call('hset', jobkey, field, value)
  return value
end

-- Adds one observation (ms) to a histogram hash: a count in the first bucket it fits, and 'sum' (the
-- number of observations is the buckets' total: no field of its own).
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
end

-- Tells the dashboard (EVENTS) that a job is now in ``state``.
local function announce(id, state)
  redis.call('publish', EVENTS, cjson.encode({type = 'job', id = id, state = state}))
end

-- Moves a job to a state: its gl_state, its RQ status, and the per-state index; for a job users know
-- (not a part of a gang job), times how long it waited to start and how long it ran, and tells the
-- dashboard (EVENTS).
local function set_state(id, jobkey, state)
  local v = redis.call('hmget', jobkey, 'gl_state', 'gl_parent', 'gl_queued_ms', 'gl_running_ms', 'gl_score')
  local old = v[1]
  if old then
    redis.call('zrem', key(K.jobs_in, old), id)
  end
  -- The job's score in JOBS, kept in its hash by its submit (a job queued before that asks JOBS).
  -- Only digits: a garbled score ("nan") must not fail the script that changes the state.
  local score = v[5] and string.match(v[5], '^%d+$') or redis.call('zscore', JOBS, id)
  if score then
    redis.call('zadd', key(K.jobs_in, state), score, id)
  end
  local fields = {'gl_state', state, 'status', RQ_STATUS[state]}
  if v[2] then
    redis.call('hset', jobkey, unpack(fields))
    return
  end
  -- Redis's clock is read only by the changes that are timed; a start's time goes in the same write.
  if state == 'queued' then
    fields[5], fields[6] = 'gl_queued_ms', now_ms()
  elseif state == 'running' then
    fields[5], fields[6] = 'gl_running_ms', now_ms()
  end
  redis.call('hset', jobkey, unpack(fields))
  if state == 'running' and tonumber(v[3]) then
    observe(START_LATENCY, START_BUCKETS, now_ms() - tonumber(v[3]))
  elseif state ~= 'queued' and state ~= 'running' and old == 'running' and tonumber(v[4]) then
    observe(RUN_TIME, RUN_BUCKETS, now_ms() - tonumber(v[4]))
  end
  if FINAL[state] then
    redis.call('hincrby', ENDED_COUNTS, state, 1)
  end
  announce(id, state)
end

-- While this worker's attempt still owns the job (the fencing check before any write of a worker),
-- its state, worker, attempt and gl_parent; else false.
local function owns(jobkey, worker, attempt)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name', 'gl_attempt', 'gl_parent')
  return (v[1] == 'scheduled' or v[1] == 'running') and v[2] == worker and v[3] == attempt and v
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

-- Adds how the current attempt ended to the job's history (gl_attempts, a JSON list), with what it
-- used (``usage``, JSON, from its worker; else what a gang job's parts added up), which is also the
-- job's usage until its next attempt ends.
local function record_attempt(jobkey, outcome, exit_code, reason, ended_at, usage)
  local v = redis.call('hmget', jobkey, 'gl_attempt', 'worker_name', 'started_at', 'gl_attempts', 'gl_identity',
    'gl_part_usage')
  usage = usage or v[6]
  local attempts = decoded(v[4], {})
  attempts[#attempts + 1] = {
    attempt = tonumber(v[1]) or 0,
    worker = (v[2] and v[2] ~= '') and display(v[2]) or cjson.null,
    identity = v[5] or cjson.null,
    outcome = outcome,
    exit_code = tonumber(exit_code) or cjson.null,
    reason = reason or cjson.null,
    started_at = (v[3] and v[3] ~= '') and v[3] or cjson.null,
    ended_at = ended_at,
    usage = decoded(usage, cjson.null),
  }
  redis.call('hset', jobkey, 'gl_attempts', cjson.encode(attempts))
  if usage then
    redis.call('hset', jobkey, 'gl_usage', usage)
  else
    redis.call('hdel', jobkey, 'gl_usage')
  end
  if v[6] then
    redis.call('hdel', jobkey, 'gl_part_usage')
  end
end

-- Adds what one part of a gang job used to its gang job's attempt (gl_part_usage): CPU time adds up;
-- a peak is the largest of any node's, as a gang job's requirements are each node's.
local function add_part_usage(jobkey, text)
  local part = decoded(text, nil)
  if not part then
    return
  end
  local sum = decoded(redis.call('hget', jobkey, 'gl_part_usage'), {})
  sum.cpu_seconds = (tonumber(sum.cpu_seconds) or 0) + (tonumber(part.cpu_seconds) or 0)
  for _, name in ipairs({'peak_memory', 'peak_gpu_memory'}) do
    local a, b = tonumber(sum[name]), tonumber(part[name])
    sum[name] = (a and b and math.max(a, b)) or a or b or cjson.null
  end
  redis.call('hset', jobkey, 'gl_part_usage', cjson.encode(sum))
end

-- Gives back what a job holds on its worker: its GPUs (only those it still holds), its CPU slots and
-- memory, and its lease. The reservation fields are cleared, so giving back twice does nothing.
-- ``held``: those fields (gl_gpu_uuids, gl_cpus, gl_memory, worker_name), if already read.
local function release(id, jobkey, held)
  local v = held or redis.call('hmget', jobkey, 'gl_gpu_uuids', 'gl_cpus', 'gl_memory', 'worker_name')
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

-- RQ's view of a worker shows one current job (its hash's current_job, which RQ's worker sets as it
-- starts a job): of the jobs a GPUlayer worker runs at once, the one it started last. A part of a
-- gang job shows as its gang job, the job RQ's tools can read. Not for a worker whose hash is gone.
local function show_current(rq_name, shown)
  local worker = key(K.rq_worker, rq_name)
  if redis.call('exists', worker) == 1 then
    redis.call('hset', worker, 'current_job', shown)
  end
end

-- A job left its worker: if RQ's view showed it, it shows the one started last of those the worker
-- still runs, or none (RQ's "idle").
local function show_next(rq_name, gone)
  local worker = key(K.rq_worker, rq_name)
  if redis.call('hget', worker, 'current_job') ~= gone then
    return
  end
  local latest, latest_at = nil, ''
  for _, other in ipairs(redis.call('smembers', key(K.worker_jobs, display(rq_name)))) do
    local v = redis.call('hmget', key(K.job, other), 'gl_state', 'started_at', 'gl_parent')
    if v[1] == 'running' and v[2] and v[2] > latest_at then
      latest, latest_at = v[3] or other, v[2]
    end
  end
  if latest then
    redis.call('hset', worker, 'current_job', latest)
  else
    redis.call('hdel', worker, 'current_job')
  end
end

-- Takes a job off the worker that holds it: RQ's started registry, the worker's set (and RQ's view of
-- its current job), what it holds.
local function detach(id, jobkey)
  local v = redis.call('hmget', jobkey, 'origin', 'gl_attempt', 'worker_name', 'gl_parent', 'gl_gpu_uuids',
    'gl_cpus', 'gl_memory')
  redis.call('zrem', key(K.started, v[1] or ''), id .. ':' .. (v[2] or '0'))
  if v[3] and v[3] ~= '' then
    redis.call('srem', key(K.worker_jobs, display(v[3])), id)
    show_next(v[3], v[4] or id)
  end
  release(id, jobkey, {v[5], v[6], v[7], v[3]})
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
  redis.call('hdel', jobkey, 'gl_exit_code', 'gl_reason', 'gl_reason_code', 'gl_cancel')
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

-- Why a job did not succeed, as RQ's tools show it (where RQ's worker puts a traceback): its reason,
-- where it ran, and the last lines of its log; ``note`` last.
local function failure_text(id, jobkey, state, note)
  local v = redis.call('hmget', jobkey, 'gl_reason', 'gl_exit_code', 'gl_attempt', 'worker_name')
  local where = 'attempt ' .. (v[3] or '0')
  if v[4] and v[4] ~= '' then
    where = where .. ' on worker ' .. display(v[4])
  end
  if v[2] then
    where = where .. ', exit code ' .. v[2]
  end
  local said = (string.gsub(state, '_', ' '))
  local lines = {'GPUlayer job ' .. id .. ' ' .. said .. ': ' .. cut(v[1] or said, 1000), where}
  local logged = redis.call('xrevrange', key(K.logs, id), '+', '-', 'COUNT', RQ_LOG_LINES)
  if #logged > 0 then
    lines[#lines + 1] = 'last lines of its log:'
  end
  for i = #logged, 1, -1 do
    local entry, fields = {}, logged[i][2]
    for f = 1, #fields, 2 do
      entry[fields[f]] = fields[f + 1]
    end
    local rank = entry.r and (' rank ' .. entry.r) or ''
    lines[#lines + 1] = '  [' .. (entry.s or '?') .. rank .. '] ' .. cut(entry.l or '', RQ_LINE_MAX)
  end
  if note then
    lines[#lines + 1] = note
  end
  return table.concat(lines, '\n')
end

-- RQ's record of how a job ended, as RQ's worker writes it and its tools read it (rq-dashboard,
-- job.latest_result(), job.exc_info): a failure's text in the hash's exc_info and a failed Result
-- (type 2) on the job's results stream. A success adds a Result (type 1) only to a job that has
-- results, one RQ requeued after a failure, so that failure no longer shows as its latest; any other
-- job is spared the key.
local function rq_result(id, jobkey, state, note)
  local results = key(K.results, id)
  local v = redis.call('hmget', jobkey, 'worker_name', 'gl_attempt')
  local common = {'worker_name', v[1] or '', 'execution_id', v[2] or '0'}
  if RQ_STATUS[state] == 'failed' then
    local text = zlib_stored(failure_text(id, jobkey, state, note))
    redis.call('hset', jobkey, 'exc_info', text)
    redis.call('xadd', results, 'MAXLEN', '~', 10, '*', 'type', 2, 'exc_string', base64(text), unpack(common))
  elseif state == 'succeeded' and redis.call('exists', results) == 1 then
    redis.call('xadd', results, 'MAXLEN', '~', 10, '*', 'type', 1, unpack(common))
  end
end

-- Ends a job in a terminal state: off its worker, RQ's registries and RQ's record of its result, the
-- done stream waiters block on (and its batch's list of ended jobs), and retention (the submitter's,
-- kept in RQ's result_ttl field). ``fields``: more field, value pairs of the job's hash to set with its
-- end (its exit code, reason, outputs), before RQ's record of its result is made from them.
local function end_job(id, jobkey, state, ended_at, fields)
  local v = redis.call('hmget', jobkey, 'origin', 'result_ttl', 'gl_idempotency', 'gl_batch', 'gl_nodes',
    'gl_retry_at')
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
  -- Only a job waiting out a back-off is in DELAYED, and only a gang job in GANGS.
  if v[6] then
    redis.call('zrem', DELAYED, id)
  end
  if v[5] then
    redis.call('zrem', GANGS, id)
  end
  set_state(id, jobkey, state)
  redis.call('hset', jobkey, 'ended_at', ended_at, unpack(fields or {}))
  redis.call('zadd', key(K[RQ_STATUS[state]], v[1] or ''), math.floor(now_ms() / 1000) + retention, id)
  redis.call('xadd', key(K.done, id), '*', 'state', state)
  rq_result(id, jobkey, state)
  if v[5] and RQ_STATUS[state] == 'failed' then
    -- Where RQ's requeue would put it back: a queue no worker may serve (gang jobs wait elsewhere).
    redis.call('sadd', GANG_ORIGINS, v[1] or '')
  end
  redis.call('del', key(K.inputs, id), key(K.checkpoint, id))
  local kept = {jobkey, key(K.logs, id), key(K.done, id), key(K.outputs, id), key(K.results, id), v[3]}
  for _, k in ipairs(kept) do
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
    redis.call('hset', jobkey, 'gl_reason', 'worker lost: ' .. lost, 'gl_reason_code', WORKER_LOST)
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
local function part_ends(part, partkey, outcome, exit_code, reason, now_text, usage)
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
  if usage then
    add_part_usage(jobkey, usage)
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
  redis.call('hset', jobkey, 'gl_reason', 'worker lost', 'gl_reason_code', WORKER_LOST)
  end_job(id, jobkey, 'failed', now_text)
  return 'failed'
end

-- Why a job's record cannot be run as it stands (a field a worker needs is missing or garbled), or
-- nil when it can.
local function unsound(jobkey, ...)
  -- Its gl_attempt, gl_spec, origin and gl_nodes, if the caller read them already.
  local v = {...}
  if select('#', ...) == 0 then
    v = redis.call('hmget', jobkey, 'gl_attempt', 'gl_spec', 'origin', 'gl_nodes')
  end
  -- Short enough to count on exactly (a Lua number), as the claim does.
  if not v[1] or not string.match(v[1], '^%d+$') or #v[1] > 15 then
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

-- A job RQ's own API put in a queue (a plain Queue.enqueue: no GPUlayer record, nothing signed it) is
-- never run: it ends failed in RQ's view (its status, its failed registry, its exc_info and latest
-- result), saying how to enqueue it, rather than vanishing from the queue.
local function refuse_unsigned(id, jobkey, queue, now_text)
  if redis.call('exists', jobkey) == 0 then
    return
  end
  local ttl = tonumber(redis.call('hget', jobkey, 'failure_ttl')) or RETENTION
  local text = zlib_stored(UNSIGNED)
  local results = key(K.results, id)
  redis.call('hset', jobkey, 'status', RQ_STATUS.failed, 'ended_at', now_text, 'exc_info', text)
  redis.call('zadd', key(K.failed, queue), math.floor(now_ms() / 1000) + ttl, id)
  redis.call('xadd', results, 'MAXLEN', '~', 10, '*', 'type', 2, 'exc_string', base64(text), 'worker_name', '',
    'execution_id', '0')
  redis.call('expire', jobkey, ttl)
  redis.call('expire', results, ttl)
end

-- RQ's requeue (rq-dashboard's, job.requeue(), a registry's requeue()) puts an ended job back in its
-- queue and calls it queued, while its gl_state still says how it ended: such a job is taken up by
-- the claim that pops it (a gang job's, which no worker's queue may hold, by the reaper).
-- A viewer's requeue never gets here: RQ's requeue writes, and the viewer's Redis user may not.
local function requeued_by_rq(jobkey, state, status)
  return FINAL[state] and (status or redis.call('hget', jobkey, 'status')) == RQ_STATUS.queued
end

-- A failed or timed-out job that RQ requeued runs again, as the next attempt of the same job:
-- unchanged, so its seal still holds, with the retries it had left, at the front of its queue (the
-- claim's next pop) or among the waiting gangs. Any other, or one whose files were deleted when it
-- ended, is put back as it was in both views, saying why in its log and to RQ.
local function take_requeue(id, jobkey, state)
  local v = redis.call('hmget', jobkey, 'gl_attempt', 'gl_spec', 'origin', 'gl_idempotency')
  local why
  if state ~= 'failed' and state ~= 'timed_out' then
    why = 'only a failed job runs again'
  else
    local spec = decoded(v[2], {})
    local inputs = type(spec.inputs) == 'table' and #spec.inputs > 0
    if (spec.source or inputs or spec['function']) and redis.call('exists', key(K.inputs, id)) == 0 then
      why = 'its files were deleted when it ended; submit it again'
    end
  end
  local registry = key(K[RQ_STATUS[state]], v[3] or '')
  if why then
    local note = 'requeue through RQ refused: ' .. why
    local ttl = redis.call('ttl', jobkey)
    ttl = ttl > 0 and ttl or RETENTION
    redis.call('hset', jobkey, 'status', RQ_STATUS[state])
    redis.call('zadd', registry, math.floor(now_ms() / 1000) + ttl, id)
    rq_result(id, jobkey, state, note)
    log_line(id, 'system', v[1] or '0', note)
    -- With the job: the log line may have made its stream, and the note its results.
    redis.call('expire', key(K.logs, id), ttl)
    redis.call('expire', key(K.results, id), ttl)
    return
  end
  log_line(id, 'system', v[1] or '0', 'requeued through RQ: it runs again')
  redis.call('zrem', registry, id)
  -- Live again: waiters wait for its new end, and its keys keep no TTL until then.
  redis.call('del', key(K.done, id))
  for _, k in ipairs({jobkey, key(K.logs, id), key(K.outputs, id), key(K.results, id)}) do
    redis.call('persist', k)
  end
  -- Its idempotency key, unless it expired and a new submit took it for another job.
  local idempotency = v[4] and string.sub(v[4], 1, #K.idempotency[1]) == K.idempotency[1]
  if idempotency and redis.call('get', v[4]) == id then
    redis.call('persist', v[4])
  end
  redis.call('hset', jobkey, 'ended_at', '')
  back_to_queue(id, jobkey, 0)
end

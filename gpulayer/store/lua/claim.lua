-- claim.lua: take up to N queued jobs from a worker's queues, in the order given, in one atomic step:
-- each job is popped from its queue, gets the GPUs, CPU slots and memory it needs on this worker, and
-- is recorded as scheduled there, together, so no crash loses a job and no two jobs hold one GPU.
-- Before any queue, it takes the parts of gang jobs placed on this worker (gang.lua reserved what they
-- hold); while the worker is held for a waiting gang job, it takes nothing from its queues.
-- KEYS[1] RQ's suspension flag   KEYS[2] the worker's set of jobs   KEYS[3] the worker's usage hash
-- KEYS[4] the worker's list of placed gang parts   KEYS[5] the worker's hold
-- ARGV[1] N   ARGV[2] worker (RQ name)   ARGV[3] now (RQ timestamp)   ARGV[4] CPU slots   ARGV[5] memory
-- ARGV[6] lease (ms): each claimed job's lease, renewed by the worker's heartbeats
-- ARGV[7] the worker's identity, recorded on each job it takes (gl_identity; a gang part's node 0 also
--         on its gang job): the only one whose signature its result and outputs are accepted under
-- ARGV[8..] per queue, five values: queue name, GPUs, CPU slots and memory each job of it needs, and the
--           worker's GPUs a job of it may use as "uuid=index,uuid=index" (best first)
-- Returns the number of gang jobs waiting for workers, then, for each claimed job: id, attempt, spec
-- JSON, queue name, GPU indices ("0,2"), for a gang part "gang job id:node" (else ''), the
-- submitter's seal over the job (else '': the worker refuses it), '1' if the claim also marked
-- it running (a job with no files to fetch first: gl_starts_at_claim), else '', and for such a job
-- its input files' hash as field, value pairs (a function's call; empty for a command).
-- A queue whose next job does not fit now is passed over; ids whose job is gone or no longer queued are
-- dropped; a job whose record cannot be run (unsound) fails, saying why, without a worker; a plain
-- RQ job (no record of GPUlayer's) fails in RQ's view, unrun (refuse_unsigned); an ended
-- job that RQ's own requeue put back in its queue runs again or is refused (take_requeue).
local out = {redis.call('zcard', GANGS)}
for _, id in ipairs(redis.call('lpop', KEYS[4], 1000) or {}) do
  local v = redis.call('hmget', key(K.job, id), 'gl_state', 'worker_name', 'gl_attempt', 'gl_spec', 'origin',
    'gl_gpus', 'gl_parent', 'gl_node', 'gl_seal')
  if v[1] == 'scheduled' and v[2] == ARGV[2] then
    redis.call('hset', key(K.job, id), 'gl_identity', ARGV[7])
    if v[8] == '0' then
      redis.call('hset', key(K.job, v[7]), 'gl_identity', ARGV[7])
    end
    out[#out + 1] = id
    for i = 3, 6 do
      out[#out + 1] = v[i]
    end
    out[#out + 1] = v[7] .. ':' .. v[8]
    out[#out + 1] = v[9] or ''
    out[#out + 1] = ''
    out[#out + 1] = {}
  end
end
-- Held for a waiting gang job, or suspended (RQ's suspend): nothing from the queues.
if redis.call('exists', KEYS[5], KEYS[1]) > 0 then
  return out
end
local want = tonumber(ARGV[1])
local used = redis.call('hmget', KEYS[3], 'cpus', 'memory')
local cpus_used, memory_used = tonumber(used[1]) or 0, tonumber(used[2]) or 0
local cpus_total, memory_total = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease_until = now_ms() + tonumber(ARGV[6])
for q = 8, #ARGV, 5 do
  local queue = ARGV[q]
  local gpus, cpus, memory = tonumber(ARGV[q + 1]), tonumber(ARGV[q + 2]), tonumber(ARGV[q + 3])
  while want > 0 and cpus_used + cpus <= cpus_total and memory_used + memory <= memory_total do
    local free_uuids, free_indices = {}, {}
    if gpus > 0 then
      for uuid, index in string.gmatch(ARGV[q + 4], '([^,=]+)=(%d+)') do
        if redis.call('exists', key(K.gpu, uuid)) == 0 then
          free_uuids[#free_uuids + 1] = uuid
          free_indices[#free_indices + 1] = index
          if #free_uuids == gpus then
            break
          end
        end
      end
      if #free_uuids < gpus then
        break
      end
    end
    local id = redis.call('lpop', key(K.queue, queue))
    if not id then
      break
    end
    local jobkey = key(K.job, id)
    -- All this claim reads of the job, in one read.
    local row = redis.call('hmget', jobkey, 'gl_state', 'gl_attempt', 'gl_spec', 'origin', 'gl_nodes', 'status',
      'gl_starts_at_claim', 'gl_seal')
    local state = row[1]
    local why = state == 'queued' and unsound(jobkey, row[2], row[3], row[4], row[5])
    if state and not RQ_STATUS[state] then
      why = 'gl_state is not a state'
    end
    if why then
      spoil(id, jobkey, why, ARGV[3])
    elseif not state then
      refuse_unsigned(id, jobkey, queue, ARGV[3])
    elseif requeued_by_rq(jobkey, state, row[6]) then
      take_requeue(id, jobkey, state)
    elseif state == 'queued' then
      local attempt = tonumber(row[2]) + 1  -- a whole number: unsound() says so
      for _, uuid in ipairs(free_uuids) do
        redis.call('set', key(K.gpu, uuid), id)
      end
      cpus_used, memory_used = cpus_used + cpus, memory_used + memory
      for field, amount in pairs({cpus = ARGV[q + 2], memory = ARGV[q + 3]}) do
        if amount ~= '0' then
          redis.call('hincrby', KEYS[3], field, amount)
        end
      end
      table.sort(free_indices, function(a, b) return tonumber(a) < tonumber(b) end)
      local indices = table.concat(free_indices, ',')
      local started = row[7] == '1'
      -- A job with nothing to fetch goes from queued to running in one step, without the state
      -- indexes' hop through scheduled, which it would hold for no time at all; the dashboard
      -- still hears of both.
      if started then
        announce(id, 'scheduled')
      end
      set_state(id, jobkey, started and 'running' or 'scheduled')
      redis.call('hset', jobkey, 'gl_attempt', attempt, 'worker_name', ARGV[2], 'gl_scheduled_at', ARGV[3],
        'gl_gpus', indices, 'gl_identity', ARGV[7],
        'gl_gpu_uuids', table.concat(free_uuids, ','), 'gl_cpus', ARGV[q + 2], 'gl_memory', ARGV[q + 3],
        'started_at', started and ARGV[3] or '')
      if started then
        show_current(ARGV[2], id)
      end
      redis.call('sadd', KEYS[2], id)
      redis.call('zadd', LEASES, lease_until, id)
      redis.call('zadd', key(K.started, queue), '+inf', id .. ':' .. attempt)
      out[#out + 1] = id
      out[#out + 1] = attempt
      out[#out + 1] = row[3]
      out[#out + 1] = queue
      out[#out + 1] = indices
      out[#out + 1] = ''
      out[#out + 1] = row[8] or ''
      out[#out + 1] = started and '1' or ''
      out[#out + 1] = started and redis.call('hgetall', key(K.inputs, id)) or {}
      want = want - 1
    end
  end
end
return out

-- gang.lua: place a waiting gang job on N distinct workers at once, or on none. On each chosen
-- worker it reserves what one node needs (GPUs, CPU slots, memory) for a part of the job, and hands
-- the part to that worker (its list of placed parts, and a wake-up). Nothing is held unless all N
-- fit: two gang jobs competing for the same workers never each hold half of what they need.
-- While the oldest waiting gang job cannot be placed and has waited past the bound, it holds the
-- first N candidates not held by another: they take no new jobs from their queues until it starts.
-- KEYS[1] the job's hash   KEYS[2] RQ's suspension flag
-- ARGV[1] job id   ARGV[2] now (RQ timestamp)   ARGV[3] lease (ms) of each part until its worker claims it
-- ARGV[4] 1 if this job may hold workers (it is the oldest gang job some set of workers could hold)
-- ARGV[5] how long (ms) it must have waited to hold them   ARGV[6] how long (ms) a hold lasts unless renewed
-- ARGV[7] GPUs, ARGV[8] CPU slots, ARGV[9] memory that each node needs
-- ARGV[10..] per candidate worker, best first, four values: its RQ name, CPU slots, memory, and the
--            GPUs a node may use there as "uuid=index,uuid=index" (best first)
-- Returns {'placed', worker, ...} (the workers of nodes 0, 1, ...), {'held', worker, ...}, {'waiting'},
-- or {'gone'} when the job is no longer waiting (or its record cannot be run: it fails, saying why).
local id, jobkey = ARGV[1], KEYS[1]
local v = redis.call('hmget', jobkey, 'gl_state', 'gl_nodes', 'gl_attempt', 'gl_spec', 'origin', 'gl_seal')
if v[1] ~= 'queued' or not redis.call('zscore', GANGS, id) then
  return {'gone'}
end
local why = unsound(jobkey) or (not v[2] and 'it has no gl_nodes')
if why then
  spoil(id, jobkey, why, ARGV[2])
  return {'gone'}
end
if redis.call('exists', KEYS[2]) == 1 then
  return {'waiting'}
end
local nodes = tonumber(v[2])
local gpus, cpus, memory = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local chosen = {}
for i = 10, #ARGV, 4 do
  local worker = ARGV[i]
  local held = redis.call('get', key(K.held, display(worker)))
  local used = redis.call('hmget', key(K.worker_usage, display(worker)), 'cpus', 'memory')
  if (not held or held == id) and (tonumber(used[1]) or 0) + cpus <= tonumber(ARGV[i + 1])
      and (tonumber(used[2]) or 0) + memory <= tonumber(ARGV[i + 2]) then
    local uuids, indices = {}, {}
    for uuid, index in string.gmatch(ARGV[i + 3], '([^,=]+)=(%d+)') do
      if #uuids == gpus then
        break
      end
      if redis.call('exists', key(K.gpu, uuid)) == 0 then
        uuids[#uuids + 1] = uuid
        indices[#indices + 1] = index
      end
    end
    if #uuids == gpus then
      table.sort(indices, function(a, b) return tonumber(a) < tonumber(b) end)
      chosen[#chosen + 1] = {worker = worker, uuids = uuids, indices = table.concat(indices, ',')}
      if #chosen == nodes then
        break
      end
    end
  end
end

if #chosen < nodes then
  local waited = now_ms() - math.floor(tonumber(redis.call('zscore', GANGS, id)) / 1000)
  if ARGV[4] ~= '1' or waited < tonumber(ARGV[5]) then
    return {'waiting'}
  end
  local free = {}
  for i = 10, #ARGV, 4 do
    local held = redis.call('get', key(K.held, display(ARGV[i])))
    if not held or held == id then
      free[#free + 1] = ARGV[i]
      if #free == nodes then
        break
      end
    end
  end
  if #free < nodes then
    return {'waiting'}
  end
  local held = {'held'}
  for n, worker in ipairs(free) do
    redis.call('set', key(K.held, display(worker)), id, 'PX', ARGV[6])
    held[n + 1] = display(worker)
  end
  return held
end

local attempt = redis.call('hincrby', jobkey, 'gl_attempt', 1)
local lease_until = now_ms() + tonumber(ARGV[3])
local parts, placed = {}, {'placed'}
for n, spot in ipairs(chosen) do
  local name = display(spot.worker)
  local part = id .. '-' .. attempt .. '-' .. (n - 1)
  local partkey = key(K.job, part)
  for _, uuid in ipairs(spot.uuids) do
    redis.call('set', key(K.gpu, uuid), part)
  end
  redis.call('hincrby', key(K.worker_usage, name), 'cpus', ARGV[8])
  redis.call('hincrby', key(K.worker_usage, name), 'memory', ARGV[9])
  redis.call('hset', partkey, 'gl_parent', id, 'gl_node', n - 1, 'gl_attempt', attempt, 'gl_spec', v[4],
    'origin', v[5], 'worker_name', spot.worker, 'gl_state', 'scheduled', 'status', RQ_STATUS.scheduled,
    'gl_scheduled_at', ARGV[2], 'gl_gpus', spot.indices, 'gl_gpu_uuids', table.concat(spot.uuids, ','),
    'gl_cpus', ARGV[8], 'gl_memory', ARGV[9], 'gl_seal', v[6] or '')
  redis.call('sadd', key(K.worker_jobs, name), part)
  redis.call('zadd', LEASES, lease_until, part)
  redis.call('rpush', key(K.worker_gang, name), part)
  redis.call('publish', key(K.worker_wake, name), part)
  parts[n] = {id = part, worker = name, gpus = spot.indices}
  placed[n + 1] = name
end
for i = 10, #ARGV, 4 do
  local hold = key(K.held, display(ARGV[i]))
  if redis.call('get', hold) == id then
    redis.call('del', hold)
  end
end
redis.call('zrem', GANGS, id)
set_state(id, jobkey, 'scheduled')
redis.call('hset', jobkey, 'worker_name', chosen[1].worker, 'gl_scheduled_at', ARGV[2],
  'gl_parts', cjson.encode(parts), 'gl_left', nodes, 'gl_running', 0)
redis.call('hdel', jobkey, 'gl_failure', 'gl_lost', 'gl_master', 'gl_retry_at')
return placed

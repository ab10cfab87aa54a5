-- submit.lua: create a job and queue it (a gang job: among the waiting gangs); or, for an idempotency key already used by a live job,
-- return that job instead; or do nothing if the id is taken.
-- KEYS[1] the job's hash   KEYS[2] its queue   KEYS[3] its input files as staged by this submit (with a
-- TTL)   KEYS[4] its input files (kept from now on)
-- ARGV[1] job id   ARGV[2] score: creation time in µs   ARGV[3] queue name
-- ARGV[4] the queue's requirements and priority (JSON), registered with its first job
-- ARGV[5] the idempotency key's Redis key, or ''
-- ARGV[6..] field, value pairs of the job's hash
-- Returns {1, id} when created, {2, id of the existing job} for a used idempotency key, {0, ''} when
-- the id is taken. A submit sent again after its reply was lost (the connection dropped, the master
-- failed over) finds its own job, of the same id and creation time: {1, id}, not a second job.
if ARGV[5] ~= '' then
  local existing = redis.call('get', ARGV[5])
  if existing and redis.call('exists', key(K.job, existing)) == 1 then
    return {2, existing}
  end
end
if redis.call('exists', KEYS[1]) == 1 then
  if redis.call('hget', KEYS[1], 'gl_score') == ARGV[2] then
    return {1, ARGV[1]}
  end
  return {0, ''}
end
redis.call('hset', KEYS[1], 'gl_score', ARGV[2], unpack(ARGV, 6))
if ARGV[5] ~= '' then
  redis.call('set', ARGV[5], ARGV[1])
  redis.call('hset', KEYS[1], 'gl_idempotency', ARGV[5])
end
redis.call('zadd', JOBS, ARGV[2], ARGV[1])
set_state(ARGV[1], KEYS[1], 'queued')
if redis.call('exists', KEYS[3]) == 1 then
  redis.call('rename', KEYS[3], KEYS[4])
  redis.call('persist', KEYS[4])
end
if sets_field(ARGV, 6, 'gl_nodes') then
  -- A gang job waits for workers to place it (gang.lua), not in a queue.
  redis.call('zadd', GANGS, ARGV[2], ARGV[1])
  redis.call('publish', GANG_WAKE, ARGV[1])
  return {1, ARGV[1]}
end
local waiting = redis.call('rpush', KEYS[2], ARGV[1])
redis.call('sadd', RQ_QUEUES, KEYS[2])
if redis.call('hsetnx', QUEUES, ARGV[3], ARGV[4]) == 1 then
  redis.call('publish', NEW_QUEUE, ARGV[3])
end
-- Only into an empty queue: jobs were already waiting, so its workers are awake or busy, and each
-- claims again as a slot frees; waking them for every job of a burst would cost each a wasted claim.
if waiting == 1 then
  redis.call('publish', key(K.wake, ARGV[3]), ARGV[1])
end
return {1, ARGV[1]}

-- submit_many.lua: create many jobs that share everything but their id, command and seal, and queue
-- them (gang jobs: among the waiting gangs), in one call. A job whose id is taken is skipped.
-- KEYS[1] their queue
-- ARGV[1] queue name   ARGV[2] the queue's requirements and priority (JSON), registered with its first job
-- ARGV[3] score of the first job: creation time in µs (each next job's is one more, so they list in order)
-- ARGV[4] n, the number of field, value pairs every job's hash holds, then those 2n values
-- then, per job: id, description, spec, seal
-- Returns one integer per job: 1 created, 0 id taken. A call sent again after its reply was lost finds
-- its own jobs (the same id and seal) and answers 1 for each, making none twice.
local shared_count = tonumber(ARGV[4])
local shared = {}
for i = 5, 4 + 2 * shared_count do
  shared[#shared + 1] = ARGV[i]
end
local gang = sets_field(shared, 1, 'gl_nodes')
local score = tonumber(ARGV[3])
local replies = {}
local queued = 0
local waiting = 0
for i = 5 + 2 * shared_count, #ARGV, 4 do
  local id = ARGV[i]
  local job = key(K.job, id)
  if redis.call('hget', job, 'gl_seal') == ARGV[i + 3] then
    score = score + 1
    replies[#replies + 1] = 1
  elseif redis.call('exists', job) == 1 then
    replies[#replies + 1] = 0
  else
    redis.call('hset', job, 'description', ARGV[i + 1], 'gl_spec', ARGV[i + 2], 'gl_seal', ARGV[i + 3],
      'gl_score', score, unpack(shared))
    redis.call('zadd', JOBS, score, id)
    set_state(id, job, 'queued')
    if gang then
      redis.call('zadd', GANGS, score, id)
    else
      waiting = redis.call('rpush', KEYS[1], id)
      queued = queued + 1
    end
    score = score + 1
    replies[#replies + 1] = 1
  end
end
if gang and #replies > 0 then
  redis.call('publish', GANG_WAKE, '')
end
if queued > 0 then
  redis.call('sadd', RQ_QUEUES, KEYS[1])
  if redis.call('hsetnx', QUEUES, ARGV[1], ARGV[2]) == 1 then
    redis.call('publish', NEW_QUEUE, ARGV[1])
  end
  -- As submit.lua: only into a queue that was empty, its workers may be asleep.
  if waiting == queued then
    redis.call('publish', key(K.wake, ARGV[1]), '')
  end
end
return replies

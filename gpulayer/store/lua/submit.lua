-- submit.lua: create a job and queue it, or do nothing if the id is taken.
-- KEYS[1] the job's hash   KEYS[2] its queue   KEYS[3] its input files (uploaded with a TTL; kept from now on)
-- ARGV[1] job id   ARGV[2] score: creation time in µs   ARGV[3] queue name
-- ARGV[4] the queue's requirements and priority (JSON), registered with its first job
-- ARGV[5..] field, value pairs of the job's hash
-- Returns 1, or 0 when a job with this id exists.
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('hset', KEYS[1], unpack(ARGV, 5))
redis.call('zadd', JOBS, ARGV[2], ARGV[1])
set_state(ARGV[1], KEYS[1], 'queued')
redis.call('rpush', KEYS[2], ARGV[1])
redis.call('sadd', RQ_QUEUES, KEYS[2])
redis.call('persist', KEYS[3])
if redis.call('hsetnx', QUEUES, ARGV[3], ARGV[4]) == 1 then
  redis.call('publish', NEW_QUEUE, ARGV[3])
end
redis.call('publish', key(K.wake, ARGV[3]), ARGV[3])
return 1

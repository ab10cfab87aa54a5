-- prune.lua: drop the ids of expired jobs from the job indexes, oldest first, expired entries from
-- RQ's registries of ended jobs (RQ cleans only those of queues with a live worker, and never its
-- cancelled one), and workers whose hash is gone (they died unannounced) from RQ's sets of workers,
-- as RQ's own maintenance would in its namespace.
-- ARGV[1] how many of the oldest ids to look at per index   ARGV[2..] queue names
-- Returns the number of ids dropped.
local dropped = 0
local indexes = {JOBS}
for state, _ in pairs(RQ_STATUS) do
  indexes[#indexes + 1] = key(K.jobs_in, state)
end
for _, index in ipairs(indexes) do
  for _, id in ipairs(redis.call('zrange', index, 0, tonumber(ARGV[1]) - 1)) do
    if redis.call('exists', key(K.job, id)) == 0 then
      redis.call('zrem', index, id)
      dropped = dropped + 1
    end
  end
end
local now = redis.call('time')[1]
for i = 2, #ARGV do
  for _, registry in ipairs({K.finished, K.failed, K.canceled}) do
    redis.call('zremrangebyscore', key(registry, ARGV[i]), 0, now)
  end
end
-- A member that is not a worker key of this installation's is dropped unread: anything that writes
-- the set could have put it there, and reading a key outside the prefix would fail this call.
local worker_prefix = key(K.rq_worker, '')
local function drop_dead(set)
  for _, worker in ipairs(redis.call('smembers', set)) do
    if string.sub(worker, 1, #worker_prefix) ~= worker_prefix or redis.call('exists', worker) == 0 then
      redis.call('srem', set, worker)
    end
  end
end
drop_dead(RQ_WORKERS)
for i = 2, #ARGV do
  drop_dead(key(K.rq_workers_of, ARGV[i]))
end
return dropped

-- prune.lua: drop the ids of expired jobs from the job indexes, oldest first, and expired entries
-- from RQ's registries of ended jobs (RQ cleans only those of queues with a live worker, and never
-- its cancelled one).
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
return dropped

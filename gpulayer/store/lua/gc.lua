-- gc.lua: end now what retention would end later: of the jobs named, each that has ended at or before
-- a time goes with its logs, outputs, result record and idempotency key, and leaves the job indexes
-- and RQ's registry of its end (its keys would expire at its retention; prune.lua would drop the ids).
-- A job not ended, or ended later, is left as it is. What is freed is counted first, so a dry run
-- (ARGV[2] 1) answers the same and deletes nothing.
-- ARGV[1] the latest end to take (RQ's timestamp format: compares as text)   ARGV[2] 1: dry run
-- ARGV[3..] job ids
-- Returns {jobs, files (output archives), bytes (Redis's MEMORY USAGE of the keys)}.
local jobs, files, bytes = 0, 0, 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local jobkey = key(K.job, id)
  local v = redis.call('hmget', jobkey, 'gl_state', 'ended_at', 'origin', 'gl_idempotency')
  if v[1] and FINAL[v[1]] and v[2] and v[2] <= ARGV[1] then
    local outputs = key(K.outputs, id)
    local owned = {jobkey, key(K.logs, id), key(K.done, id), outputs, key(K.results, id),
      key(K.inputs, id), key(K.checkpoint, id)}
    -- Only a key of the kind it should name: a garbled field must not delete any other key.
    if v[4] and string.sub(v[4], 1, #K.idempotency[1]) == K.idempotency[1] then
      owned[#owned + 1] = v[4]
    end
    jobs = jobs + 1
    files = files + redis.call('exists', outputs)
    for _, k in ipairs(owned) do
      bytes = bytes + (tonumber(redis.call('memory', 'usage', k)) or 0)
    end
    if ARGV[2] ~= '1' then
      redis.call('del', unpack(owned))
      redis.call('zrem', JOBS, id)
      redis.call('zrem', key(K.jobs_in, v[1]), id)
      redis.call('zrem', key(K[RQ_STATUS[v[1]]], v[3] or ''), id)
    end
  end
end
return {jobs, files, bytes}

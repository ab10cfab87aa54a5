-- finish.lua: end an attempt the way it ended, if that attempt still owns the job: its staged outputs
-- become the job's outputs, and the attempt joins the job's history. A non-zero exit with a retry
-- left for it (retry_on exit or both) puts the job back in its queue after its back-off; anything
-- else ends the job.
-- KEYS[1] the job's hash   KEYS[2] the worker's RQ hash   KEYS[3] the attempt's staged outputs
-- KEYS[4] the job's outputs (for node 0 of a gang job, the gang job's)
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4] state (for a part of a gang job,
-- also 'unstarted': it could not start its ranks)   ARGV[5] exit code or ''
-- ARGV[6] reason or ''   ARGV[7] now (RQ timestamp)   ARGV[8] outputs summary JSON or ''   ARGV[9] seconds run
-- ARGV[10] what the attempt used (JobUsage JSON) or ''
-- Returns 1 when the job ended, 2 when it will run again, 0 when this attempt lost the job (nothing
-- is written).
local held = owns(KEYS[1], ARGV[2], ARGV[3])
if not held then
  return 0
end
if redis.call('exists', KEYS[3]) == 1 then
  redis.call('rename', KEYS[3], KEYS[4])
end
if redis.call('exists', KEYS[2]) == 1 then
  local counter = ARGV[4] == 'succeeded' and 'successful_job_count' or 'failed_job_count'
  redis.call('hincrby', KEYS[2], counter, 1)
  redis.call('hincrbyfloat', KEYS[2], 'total_working_time', ARGV[9])
end
local parent = held[4]
if parent then
  -- A part of a gang job: what node 0 uploaded is the gang job's outputs; the gang decides the rest.
  if ARGV[8] ~= '' then
    redis.call('hset', key(K.job, parent), 'gl_outputs', ARGV[8])
  end
  part_ends(ARGV[1], KEYS[1], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[10] ~= '' and ARGV[10] or nil)
  return 1
end
record_attempt(KEYS[1], ARGV[4], ARGV[5], ARGV[6] ~= '' and ARGV[6] or nil, ARGV[7], ARGV[10] ~= '' and ARGV[10] or nil)
if ARGV[4] == 'failed' and ARGV[5] ~= '' and ARGV[5] ~= '0' then
  local delay = use_retry(KEYS[1], 'exit')
  if delay then
    log_line(ARGV[1], 'system', ARGV[3], ARGV[6] .. '; retrying in ' .. (delay / 1000) .. ' s')
    detach(ARGV[1], KEYS[1])
    back_to_queue(ARGV[1], KEYS[1], delay)
    return 2
  end
end
local fields = {}
for field, value in pairs({gl_exit_code = ARGV[5], gl_reason = ARGV[6], gl_outputs = ARGV[8]}) do
  if value ~= '' then
    fields[#fields + 1] = field
    fields[#fields + 1] = value
  end
end
end_job(ARGV[1], KEYS[1], ARGV[4], ARGV[7], fields)
return 1

-- finish.lua: end a job the way its attempt ended, if that attempt still owns it; its staged outputs
-- become the job's outputs in the same step.
-- KEYS[1] the job's hash   KEYS[2] the worker's set of jobs   KEYS[3] the worker's RQ hash
-- KEYS[4] the attempt's staged outputs   KEYS[5] the job's outputs
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4] state   ARGV[5] exit code or ''
-- ARGV[6] reason or ''   ARGV[7] now (RQ timestamp)   ARGV[8] outputs summary JSON or ''   ARGV[9] seconds run
-- Returns 1, or 0 when this attempt lost the job (nothing is written).
if not owns(KEYS[1], ARGV[2], ARGV[3]) then
  return 0
end
redis.call('srem', KEYS[2], ARGV[1])
if redis.call('exists', KEYS[4]) == 1 then
  redis.call('rename', KEYS[4], KEYS[5])
end
local optional = {gl_exit_code = ARGV[5], gl_reason = ARGV[6], gl_outputs = ARGV[8]}
for field, value in pairs(optional) do
  if value ~= '' then
    redis.call('hset', KEYS[1], field, value)
  end
end
end_job(ARGV[1], KEYS[1], ARGV[4], ARGV[7])
if redis.call('exists', KEYS[3]) == 1 then
  local counter = ARGV[4] == 'succeeded' and 'successful_job_count' or 'failed_job_count'
  redis.call('hincrby', KEYS[3], counter, 1)
  redis.call('hincrbyfloat', KEYS[3], 'total_working_time', ARGV[9])
end
return 1

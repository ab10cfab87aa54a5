-- append_logs.lua: add a batch of a job's log lines, if this attempt still owns the job.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4..] stream, line pairs
-- Returns 1, or 0 when this attempt lost the job (nothing is written).
if not owns(KEYS[1], ARGV[2], ARGV[3]) then
  return 0
end
for i = 4, #ARGV, 2 do
  log_line(ARGV[1], ARGV[i], ARGV[3], ARGV[i + 1])
end
return 1

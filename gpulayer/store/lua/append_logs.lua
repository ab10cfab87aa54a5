-- append_logs.lua: add a batch of a job's log lines, if this attempt still owns the job. The lines of
-- a part of a gang job go to the gang job's log, each with its rank.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4..] stream, line, rank ('' for
-- none) triples
-- Returns 1, or 0 when this attempt lost the job (nothing is written).
if not owns(KEYS[1], ARGV[2], ARGV[3]) then
  return 0
end
local id = redis.call('hget', KEYS[1], 'gl_parent') or ARGV[1]
for i = 4, #ARGV, 3 do
  log_line(id, ARGV[i], ARGV[3], ARGV[i + 1], ARGV[i + 2])
end
return 1

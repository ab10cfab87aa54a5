-- keep_checkpoint.lua: an attempt uploaded its checkpoint folder's archive (staged): it becomes the
-- job's checkpoint, what a retry starts from, if the attempt still owns the job; else it is dropped.
-- KEYS[1] the job's (or gang part's) hash   KEYS[2] the staged archive   KEYS[3] the job's checkpoint
-- ARGV[1] worker (RQ name)   ARGV[2] attempt
-- Returns 1 if kept, 0 if this attempt lost the job.
if not owns(KEYS[1], ARGV[1], ARGV[2]) then
  redis.call('del', KEYS[2])
  return 0
end
redis.call('rename', KEYS[2], KEYS[3])
redis.call('persist', KEYS[3])
return 1

-- start.lua: a scheduled job's process is about to start: mark it running.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4] now (RQ timestamp)
-- Returns 'ok'; 'cancel' if a cancel arrived while its files were fetched; 'stale' if this attempt lost the job.
if not owns(KEYS[1], ARGV[2], ARGV[3]) then
  return 'stale'
end
if redis.call('hget', KEYS[1], 'gl_cancel') == '1' then
  return 'cancel'
end
set_state(ARGV[1], KEYS[1], 'running')
redis.call('hset', KEYS[1], 'started_at', ARGV[4])
return 'ok'

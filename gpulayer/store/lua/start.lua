-- start.lua: a scheduled job's process is about to start: mark it running, and RQ's view of its
-- worker names it as the current job. For a part of a gang job, the gang job is running once all its
-- parts are; the part on node 0 says where rank 0 listens.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] worker (RQ name)   ARGV[3] attempt   ARGV[4] now (RQ timestamp)
-- ARGV[5] for node 0 of a gang job, rank 0's address as "host:port"; else ''
-- Returns 'ok'; 'cancel' if a cancel arrived while its files were fetched; 'stale' if this attempt lost the job.
if not owns(KEYS[1], ARGV[2], ARGV[3]) then
  return 'stale'
end
if redis.call('hget', KEYS[1], 'gl_cancel') == '1' then
  return 'cancel'
end
set_state(ARGV[1], KEYS[1], 'running')
redis.call('hset', KEYS[1], 'started_at', ARGV[4])
local parent = redis.call('hget', KEYS[1], 'gl_parent')
show_current(ARGV[2], parent or ARGV[1])
if parent then
  local jobkey = key(K.job, parent)
  if ARGV[5] ~= '' then
    redis.call('hset', jobkey, 'gl_master', ARGV[5])
  end
  if add(jobkey, 'gl_running', 1) == tonumber(redis.call('hget', jobkey, 'gl_nodes')) then
    set_state(parent, jobkey, 'running')
    redis.call('hset', jobkey, 'started_at', ARGV[4])
  end
end
return 'ok'

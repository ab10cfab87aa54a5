-- spoil.lua: fail a waiting (queued) job whose record a client cannot read, saying why, so that it is
-- neither lost nor left to wait for ever; what it held in its queue or among the waiting gangs goes.
-- KEYS[1] the job's hash
-- ARGV[1] job id   ARGV[2] why (after "corrupt record: ")   ARGV[3] now (RQ timestamp)
-- Returns 1 if the job failed, 0 if it was no longer waiting.
if redis.call('hget', KEYS[1], 'gl_state') ~= 'queued' then
  return 0
end
redis.call('lrem', key(K.queue, redis.call('hget', KEYS[1], 'origin') or ''), 0, ARGV[1])
spoil(ARGV[1], KEYS[1], ARGV[2], ARGV[3])
return 1

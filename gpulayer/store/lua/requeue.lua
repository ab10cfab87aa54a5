-- requeue.lua: take jobs off a worker. 'lost' (the worker restarted under its name, so its previous
-- process is gone): each runs again if it has a retry left for a lost worker, else fails. 'returned'
-- (a cold shutdown gives them back on purpose): each goes to the front of its queue, no retry used.
-- A job whose cancel was requested ends cancelled instead. A part of a gang job takes the whole gang
-- job with it: back to wait for workers.
-- KEYS[1] the worker's set of jobs
-- ARGV[1] worker (RQ name)   ARGV[2] 'lost' or 'returned'   ARGV[3] line for each job's log and history
-- ARGV[4] now (RQ timestamp)   ARGV[5..] job ids; none means every job in the set
-- Returns the number of jobs taken off the worker.
local ids = redis.call('smembers', KEYS[1])
if #ARGV > 4 then
  ids = {unpack(ARGV, 5)}
end
local moved = 0
for _, id in ipairs(ids) do
  local jobkey = key(K.job, id)
  local v = redis.call('hmget', jobkey, 'gl_state', 'worker_name', 'gl_attempt', 'gl_cancel')
  if (v[1] == 'scheduled' or v[1] == 'running') and v[2] == ARGV[1] then
    if ARGV[2] == 'lost' then
      lose(id, jobkey, ARGV[3], ARGV[4])
    elseif redis.call('hexists', jobkey, 'gl_parent') == 1 then
      part_ends(id, jobkey, 'returned', nil, ARGV[3], ARGV[4])
    else
      record_attempt(jobkey, 'returned', nil, ARGV[3], ARGV[4])
      log_line(id, 'system', v[3], ARGV[3])
      if v[4] == '1' then
        redis.call('hset', jobkey, 'gl_reason', 'cancelled')
        end_job(id, jobkey, 'cancelled', ARGV[4])
      else
        detach(id, jobkey)
        back_to_queue(id, jobkey, 0)
      end
    end
    moved = moved + 1
  end
  redis.call('srem', KEYS[1], id)
end
return moved

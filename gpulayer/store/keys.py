"""Every Redis key and channel GPUlayer reads or writes, in one place (see docs/architecture/redis-keys.md).

Every key lives under the installation's prefix: ours, and RQ's, because jobs and workers are RQ's
(``rq info`` and rq-dashboard see them), under ``<prefix>:rq:`` (:class:`~.rq_names.RQNames`). The
Lua scripts get the same templates (:meth:`Keys.lua_templates`), so a key is spelled in one place.
"""

from __future__ import annotations

import hashlib

from ..models import QueueSpec
from .rq_names import RQNames

#: The requirement set of a job that asks for nothing in particular.
DEFAULT_CAPABILITY = "default"


class Keys:
    """Key names for one installation (one prefix). ``{}`` in a template: a job id, queue or worker name."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: RQ's names, in this installation's namespace.
        self.rq = rq = RQNames.of(prefix)
        #: Sorted set of every job id, scored by creation time (µs).
        self.jobs = f"{prefix}:jobs"
        #: Hash of every queue's requirements and priority (JSON), by queue name: what workers read to
        #: decide which queues they serve.
        self.queues = f"{prefix}:queues"
        #: Channel the name of a queue is published on when its first job arrives.
        self.new_queue = f"{prefix}:queues:new"
        #: Sorted set of the ids of jobs a worker holds, scored by when their lease expires (ms, by
        #: Redis's clock); heartbeats push the score on, the reaper takes what falls behind.
        self.leases = f"{prefix}:leases"
        #: Sorted set of the ids of jobs waiting out a retry's back-off, scored by when they go back
        #: in their queue (ms, by Redis's clock).
        self.delayed = f"{prefix}:delayed"
        #: Sorted set of the ids of distributed (gang) jobs waiting for workers, scored by creation
        #: time (µs): they wait here, not in a queue, because no single worker can take one.
        self.gangs = f"{prefix}:gangs"
        #: Channel a gang job's id is published on when it starts waiting, so workers try to place it.
        self.gang_wake = f"{prefix}:gangs:wake"
        #: Set of the queue names of gang jobs that failed: where RQ's own requeue puts one back, in a
        #: queue no worker may serve, so the reaper looks there.
        self.gang_origins = f"{prefix}:gangs:origins"
        #: Set of the ids of queued jobs a plain ``rq worker`` took (it cannot run them: their RQ
        #: callable says so and marks them here), for the reaper to put back in their queues once RQ's
        #: worker has failed them.
        self.taken_by_rq = f"{prefix}:rq-taken"
        #: The name of the worker placing gang jobs now (with a short TTL): one at a time, so a big
        #: fleet does not read every worker's record once per worker.
        self.gangs_placing = f"{prefix}:gangs:placing"
        #: Where the keys of API tokens and browser sessions live: apart from the rest (``#`` is never
        #: in a prefix), so Redis's users can give them to the HTTP server and the admin only.
        self.auth = f"{prefix}#auth:"
        #: Hash of identity names → each machine's identity record, signed by the admin (JSON): whose
        #: signatures on results and archives are accepted. Apart from the rest, so the admin alone
        #: writes it (on Redis 7 every other role may only read it).
        self.identities = f"{prefix}#identities"
        #: Where the autoscaler keeps what it started and decided (docs/capacity.md): apart, so its
        #: role writes these keys and reads the rest.
        self.capacity = f"{prefix}:capacity:"
        #: Hash of machine name → each machine the autoscaler started (JSON), stopped ones for a day.
        self.capacity_machines = f"{self.capacity}machines"
        #: Hash of a queue's name, or ``gang:<job id>`` → the autoscaler's last decision about its jobs
        #: (JSON): what `gpulayer why` shows.
        self.capacity_decisions = f"{self.capacity}decisions"
        #: The id of the autoscaler that acts now (with a TTL it renews): one at a time, so a restart,
        #: or a second one started by mistake, starts no duplicates.
        self.capacity_leader = f"{self.capacity}leader"
        #: Hash of API token names → the SHA-256 of each token (its record's key).
        self.tokens = f"{self.auth}tokens"
        #: Channel a token's name is published on when it is revoked (open websockets close).
        self.tokens_revoked = f"{self.auth}tokens:revoked"
        #: Channel every job's state change, worker arrival and departure, and worker telemetry sample
        #: is published on (JSON), for the dashboard's live view (``/ws/events``).
        self.events = f"{prefix}:events"
        #: Stream of samples of the whole installation (jobs by state, queue depths), one per telemetry
        #: interval, capped at an hour's worth: the dashboard's activity charts.
        self.activity = f"{prefix}:activity"
        #: The name of the worker that takes the current activity sample (with a TTL of about one
        #: interval): one sample per interval, however many workers there are.
        self.activity_turn = f"{prefix}:activity:turn"
        #: Hashes of the submit-to-start and run-time histograms (counts per bucket, ``sum`` in ms,
        #: ``count``), kept up by the scripts as jobs start and end; read by /metrics.
        self.start_latency = f"{prefix}:metrics:start-latency"
        self.run_time = f"{prefix}:metrics:run-time"
        #: Hash of how many jobs ended in each final state, ever (a counter for Prometheus's rate()).
        self.ended_counts = f"{prefix}:metrics:ended"
        #: RQ's set of queue keys, read by ``rq info``.
        self.rq_queues = rq.queues
        #: RQ's set of live worker keys, read by ``rq info``.
        self.rq_workers = rq.workers
        #: Set by ``rq suspend``; while it exists no job is claimed.
        self.rq_suspended = rq.suspended
        self._templates = {
            # The job's hash: RQ's fields, and ours prefixed ``gl_``.
            "job": rq.job,
            # RQ's stream of a job's results, by job id: what RQ's tools read to say why it failed.
            "results": rq.results,
            # An RQ queue (a list of job ids), by queue name.
            "queue": rq.queue,
            # Sorted set of the ids of jobs in one state, scored by creation time (µs).
            "jobs_in": f"{prefix}:jobs:{{}}",
            # Stream of a job's log lines, capped at the last ``log_max_lines``.
            "logs": f"{prefix}:logs:{{}}",
            # Stream with one entry, added when the job ends; waiters block on it.
            "done": f"{prefix}:done:{{}}",
            # Hash of a job's source and input archives, in chunks (or, for inputs too large for Redis,
            # their record: who serves them, or their object store URL); with a store, the URLs the
            # job's outputs archive goes to and is read from.
            "inputs": f"{prefix}:files:{{}}:in",
            # Hash of a job's output archive (or a function's result), in chunks.
            "outputs": f"{prefix}:files:{{}}:out",
            # Hash of the archive of a job's checkpoint folder (GPULAYER_CHECKPOINT_DIR), as its latest
            # attempt last kept it: what a retry starts from.
            "checkpoint": f"{prefix}:files:{{}}:ckpt",
            # Hash of a code bundle (the project folder remote functions run from), in chunks, by the
            # SHA-256 of its contents; kept a week past its last use.
            "bundle": f"{prefix}:bundle:{{}}",
            # List of the ids of a batch's jobs (one ``.map``), pushed as each ends, by the batch's token.
            "ended": f"{prefix}:ended:{{}}",
            # List of the ids of the parts of gang jobs placed on a worker (their resources already
            # reserved), which it takes before any queue; by worker name.
            "worker_gang": f"{prefix}:worker:{{}}:gang",
            # Channel a gang part's id is published on when it is placed on the worker, by worker name.
            "worker_wake": f"{prefix}:worker:{{}}:wake",
            # The id of the gang job a worker is held for (with a TTL): while it exists, the worker
            # takes no new job from its queues, so the gang is not starved; by worker name.
            "held": f"{prefix}:worker:{{}}:held",
            # Stream of a worker's telemetry samples (CPU, memory, each GPU's use), capped at an hour's
            # worth and gone an hour after its last, by worker name.
            "telemetry": f"{prefix}:telemetry:{{}}",
            # Stream of the requests for outputs a worker holds (an id, a job, an offset, the asking
            # client's key), by worker name; capped, and gone a day after the last.
            "transfers": f"{prefix}:worker:{{}}:transfers",
            # When a worker last said it serves the outputs it holds (ISO time), kept a retention
            # period: how a client tells a worker gone, and since when; by worker name.
            "serving": f"{prefix}:worker:{{}}:serving",
            # List of one transfer's messages, sender to receiver (a signed hello, then chunks sealed
            # to the receiver; never more than a window of them), by transfer id (random, the asker's).
            "transfer": f"{prefix}:transfer:{{}}",
            # List of the receiver's acks of one transfer (how many chunks it has written), by id.
            "transfer_acks": f"{prefix}:transfer:{{}}:acks",
            # Set of the ids of jobs a worker has taken and not ended, by worker name.
            "worker_jobs": f"{prefix}:worker:{{}}:jobs",
            # Hash of what a worker's running jobs hold (cpus, memory), by worker name.
            "worker_usage": f"{prefix}:worker:{{}}:usage",
            # The id of the job holding a GPU, by GPU UUID: one key per device, so no two jobs (nor two
            # workers offering the same device) can ever hold one GPU.
            "gpu": f"{prefix}:gpu:{{}}",
            # Channel a submit (or a requeue) publishes the job's id on, by queue name, so the idle
            # workers serving it wake at once.
            "wake": f"{prefix}:wake:{{}}",
            # The id of the job submitted with an idempotency key, by the key's SHA-256.
            "idempotency": f"{prefix}:idempotency:{{}}",
            # RQ's worker hash and command channel, by RQ worker name (see rq_worker_name).
            "rq_worker": rq.worker,
            "pubsub": rq.pubsub,
            # RQ's set of the workers serving a queue, by queue name: what ``rq info`` lists under it.
            "rq_workers_of": rq.workers_of,
            # RQ's registries, by queue name: running (scored +inf: RQ never reaps ours), and ended.
            "started": rq.started,
            "finished": rq.finished,
            "failed": rq.failed,
            "canceled": rq.canceled,
        }

    def _key(self, template: str, value: str) -> str:
        return self._templates[template].format(value)

    def job(self, job_id: str) -> str:
        return self._key("job", job_id)

    def jobs_in(self, state: str) -> str:
        return self._key("jobs_in", state)

    def logs(self, job_id: str) -> str:
        return self._key("logs", job_id)

    def done(self, job_id: str) -> str:
        return self._key("done", job_id)

    def results(self, job_id: str) -> str:
        return self._key("results", job_id)

    def inputs(self, job_id: str) -> str:
        return self._key("inputs", job_id)

    def outputs(self, job_id: str) -> str:
        return self._key("outputs", job_id)

    def staged_inputs(self, job_id: str, upload: str) -> str:
        """A submit's files while uploading; renamed to :meth:`inputs` only if the job is created, so a
        submit that finds its id taken never touches the other job's files."""
        return f"{self.inputs(job_id)}:{upload}"

    def checkpoint(self, job_id: str) -> str:
        return self._key("checkpoint", job_id)

    def staged_checkpoint(self, job_id: str, attempt: int) -> str:
        """An attempt's checkpoint archive while uploading; renamed to :meth:`checkpoint` if the
        attempt still owns the job."""
        return f"{self.checkpoint(job_id)}:{attempt}"

    def bundle(self, digest: str) -> str:
        return self._key("bundle", digest)

    def ended(self, token: str) -> str:
        return self._key("ended", token)

    def staged_outputs(self, job_id: str, attempt: int) -> str:
        """An attempt's outputs while uploading; renamed to :meth:`outputs` if it still owns the job."""
        return f"{self.outputs(job_id)}:{attempt}"

    def transfers(self, worker: str) -> str:
        return self._key("transfers", worker)

    def serving(self, worker: str) -> str:
        return self._key("serving", worker)

    def transfer(self, transfer_id: str) -> str:
        return self._key("transfer", transfer_id)

    def transfer_acks(self, transfer_id: str) -> str:
        return self._key("transfer_acks", transfer_id)

    def worker_jobs(self, worker: str) -> str:
        return self._key("worker_jobs", worker)

    def worker_usage(self, worker: str) -> str:
        return self._key("worker_usage", worker)

    def worker_gang(self, worker: str) -> str:
        return self._key("worker_gang", worker)

    def worker_wake(self, worker: str) -> str:
        return self._key("worker_wake", worker)

    def held(self, worker: str) -> str:
        return self._key("held", worker)

    def telemetry(self, worker: str) -> str:
        return self._key("telemetry", worker)

    def gpu(self, uuid: str) -> str:
        return self._key("gpu", uuid)

    def wake(self, queue_name: str) -> str:
        return self._key("wake", queue_name)

    def login_failures(self, client: str) -> str:
        """Failed logins from one address in the current window (a counter with a TTL)."""
        return f"{self.auth}login-failures:{client}"

    def token(self, digest: str) -> str:
        """An API token's record (name, role, times), by the token's SHA-256; it expires with the token."""
        return f"{self.auth}token:{digest}"

    def session(self, digest: str) -> str:
        """A browser session's record (its token's SHA-256, its CSRF token), by the SHA-256 of the
        session's cookie; it expires with the session. Redis never holds the cookie itself."""
        return f"{self.auth}session:{digest}"

    def idempotency(self, key: str) -> str:
        """Hashed, so any key a user picks makes a short, safe Redis key."""
        return self._key("idempotency", hashlib.sha256(key.encode()).hexdigest())

    def queue_name(self, capability: str = DEFAULT_CAPABILITY, priority: int = 0) -> str:
        """The RQ queue name for jobs of one requirement set and priority."""
        return f"{self.prefix}:{capability}" + (f":p{priority}" if priority else "")

    def queue_for(self, spec: QueueSpec) -> str:
        """The queue of jobs with these requirements and priority."""
        return self.queue_name(spec.requirements.capability, spec.priority)

    def queue(self, queue_name: str) -> str:
        return self._key("queue", queue_name)

    def rq_workers_of(self, queue_name: str) -> str:
        return self._key("rq_workers_of", queue_name)

    def rq_worker_name(self, worker: str) -> str:
        """The name RQ knows a worker by, and RQ's tools show: prefixed with the installation's."""
        return f"{self.prefix}:{worker}"

    def worker_display_name(self, rq_worker_name: str) -> str:
        return rq_worker_name.removeprefix(f"{self.prefix}:")

    def rq_worker(self, worker: str) -> str:
        return self._key("rq_worker", self.rq_worker_name(worker))

    def pubsub(self, worker: str) -> str:
        """The channel RQ's worker commands (``stop-job``, ``shutdown``) arrive on."""
        return self._key("pubsub", self.rq_worker_name(worker))

    def lua_templates(self) -> dict[str, tuple[str, str]]:
        """Each template split around its ``{}``, for the scripts' ``key(K.name, value)``."""
        return {
            name: (head, tail)
            for name, (head, _, tail) in ((name, t.partition("{}")) for name, t in self._templates.items())
        }

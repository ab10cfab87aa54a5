"""A Redis watched by Sentinel on loopback ports, as docs/deploy.md lays one out: a master, a replica
and three sentinels (a quorum of two). The nodes' default user has a password: it is their admin,
the one replicas and sentinels log in as. The installation's users are made on the nodes by
`gpulayer access init --apply` through a Sentinel URL, as an operator would. With ``tls``, every
node and sentinel speaks TLS only, with a certificate the given CA signed."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import redis

from gpulayer.network import free_port
from gpulayer.server import listening, redis_server_binary, start_redis, wait_ready
from gpulayer.store.acl import password_hash
from gpulayer.tls import ServerFiles

#: The name the sentinels know the master by.
MASTER = "gl"
NODE_PASSWORD = "nodes-own-admin"
#: Quick to declare a master down: the tests and the benchmark wait for failovers.
DOWN_AFTER_MS = 1000


@dataclasses.dataclass
class Replicated:
    folder: Path
    #: The data nodes, by port.
    nodes: dict[int, subprocess.Popen[bytes]]
    #: The sentinels, by port.
    sentinels: dict[int, subprocess.Popen[bytes]]
    tls: ServerFiles | None = None

    def url(self, user: str = "default", password: str = NODE_PASSWORD) -> str:
        """A Sentinel URL of the master, as ``user``."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        return f"{'rediss' if self.tls else 'redis'}+sentinel://{user}:{password}@{hosts}/{MASTER}"

    def connect(self, port: int, **options: object) -> redis.Redis:
        """A connection to a node or sentinel, over TLS where they speak it."""
        if self.tls is not None:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca), ssl_check_hostname=False)
        return redis.Redis(port=port, socket_timeout=5, **options)  # type: ignore[arg-type]

    def master(self) -> int:
        """The master's port, as a sentinel says."""
        watcher = self.connect(next(iter(self.sentinels)))
        try:
            _host, port = watcher.sentinel_get_master_addr_by_name(MASTER)  # type: ignore[no-untyped-call]
        finally:
            watcher.close()
        return int(port)

    def node(self, port: int) -> redis.Redis:
        """A node's own admin connection."""
        return self.connect(port, password=NODE_PASSWORD)

    def kill_master(self) -> int:
        """SIGKILL the master; its port."""
        port = self.master()
        self.nodes[port].kill()
        self.nodes[port].wait(10)
        return port

    def stop(self) -> None:
        for process in [*self.sentinels.values(), *self.nodes.values()]:
            process.kill()
            process.wait(10)


def start_replicated(folder: Path, tls: ServerFiles | None = None) -> Replicated:
    """The master, its replica and three sentinels, each once it answers and sees the others."""
    binary = redis_server_binary()
    master, replica = free_port(), free_port()
    users = f"user default on #{password_hash(NODE_PASSWORD)} ~* &* +@all\n"
    nodes = {}
    for port, role in ((master, []), (replica, [f"replicaof 127.0.0.1 {master}"])):
        nodes[port] = start_redis(
            folder / f"node-{port}",
            port,
            acl=users,
            binary=binary,
            tls=tls,
            # No 5 s wait before a replica's first sync, as Redis 7 makes by default.
            extra=[f"masterauth {NODE_PASSWORD}", "repl-diskless-sync-delay 0", *_replication(tls), *role],
        )
        scheme = "rediss" if tls else "redis"
        ca = tls.ca.read_text() if tls else None
        wait_ready(f"{scheme}://default:{NODE_PASSWORD}@127.0.0.1:{port}/0", nodes[port], ca=ca)
    sentinels = {
        port: _sentinel(folder, port, master, binary, tls) for port in (free_port(), free_port(), free_port())
    }
    made = Replicated(folder, nodes, sentinels, tls)
    deadline = time.monotonic() + 30
    while not _settled(made, replica):
        if time.monotonic() > deadline:
            made.stop()
            raise TimeoutError(f"the sentinels did not settle: see {folder}")
        time.sleep(0.1)
    return made


def _replication(tls: ServerFiles | None) -> list[str]:
    """Replicas and sentinels reach the nodes over TLS too, where the nodes speak only that."""
    return ["tls-replication yes"] if tls else []


def _sentinel(
    folder: Path, port: int, master: int, binary: str, tls: ServerFiles | None
) -> subprocess.Popen[bytes]:
    config = folder / f"sentinel-{port}.conf"  # Sentinel rewrites its file: not private to us
    config.write_text(
        "\n".join(
            [
                *listening(port, tls),
                *_replication(tls),
                "bind 127.0.0.1",
                f"dir {folder}",
                f"logfile {folder / f'sentinel-{port}.log'}",
                f"sentinel monitor {MASTER} 127.0.0.1 {master} 2",
                f"sentinel auth-pass {MASTER} {NODE_PASSWORD}",
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {MASTER} 10000",
                f"sentinel parallel-syncs {MASTER} 1",
            ]
        )
        + "\n"
    )
    return subprocess.Popen(
        [binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _settled(made: Replicated, replica: int) -> bool:
    """The replica in sync, and each sentinel sees it and the two other sentinels."""
    node = made.node(replica)
    try:
        if node.info("replication").get("master_link_status") != "up":
            return False
    finally:
        node.close()
    for port in made.sentinels:
        watcher = made.connect(port)
        try:
            state = watcher.sentinel_master(MASTER)  # type: ignore[no-untyped-call]
            replicas = watcher.sentinel_slaves(MASTER)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError:
            return False
        finally:
            watcher.close()
        if state["num-other-sentinels"] < 2 or [r["port"] for r in replicas] != [replica]:
            return False
    return True

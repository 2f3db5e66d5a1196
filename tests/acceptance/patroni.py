"""A Patroni cluster of the test's own (issue 39): one etcd and PostgreSQL 15 nodes under
Patroni, each on its own ports, in a temporary directory the postgres user owns (Debian's
``patroni`` and ``etcd-server`` packages; ``make topologies`` installs them). The
configuration is the wave-3 trial's (docs/guides/topologies.md#patroni)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.acceptance.servers import PG_BIN, can_start_postgresql, free_port

PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"


def can_start_patroni() -> bool:
    return os.path.exists(PATRONI) and os.path.exists(ETCD) and can_start_postgresql()


def _node_config(cluster: PatroniCluster, node: int) -> str:
    """Patroni's YAML for node ``node`` (JSON is YAML)."""
    return json.dumps({
        "scope": "sqlqueue", "namespace": "/sqlqueue/", "name": f"node{node}",
        "restapi": {"listen": f"127.0.0.1:{cluster.rest_ports[node]}",
                    "connect_address": f"127.0.0.1:{cluster.rest_ports[node]}"},
        "etcd3": {"hosts": f"127.0.0.1:{cluster.etcd_port}"},
        "bootstrap": {
            "dcs": {"ttl": 10, "loop_wait": 2, "retry_timeout": 5,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": cluster.synchronous,
                    "postgresql": {"use_pg_rewind": False, "parameters": {
                        "wal_level": "replica", "hot_standby": "on", "max_wal_senders": 5,
                        "max_replication_slots": 5, "max_connections": 60,
                        "shared_buffers": "32MB", "fsync": "off"}}},
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"},
                       {"auth-local": "trust"}, {"auth-host": "trust"}],
            "pg_hba": ["host replication replicator 127.0.0.1/32 trust",
                       "host all all 127.0.0.1/32 trust"]},
        "postgresql": {
            "listen": f"127.0.0.1:{cluster.pg_ports[node]}",
            "connect_address": f"127.0.0.1:{cluster.pg_ports[node]}",
            "data_dir": str(cluster.root / f"pg{node}"), "bin_dir": str(PG_BIN),
            "pgpass": str(cluster.root / f"pgpass{node}"),
            "authentication": {"replication": {"username": "replicator", "password": "rep"},
                               "superuser": {"username": "postgres", "password": "pg"}},
            "parameters": {"unix_socket_directories": str(cluster.root)}},
        "watchdog": {"mode": "off"},
    })


class PatroniCluster:
    """etcd and ``size`` Patroni nodes. ``synchronous``: Patroni's synchronous_mode."""

    def __init__(self, size: int = 2, synchronous: bool = False) -> None:
        import pwd

        account = pwd.getpwnam("postgres")
        self.uid, self.gid = account.pw_uid, account.pw_gid
        self.root = Path(tempfile.mkdtemp(prefix="sqlqueue-patroni-"))
        os.chown(self.root, self.uid, self.gid)
        self.size = size
        self.synchronous = synchronous
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.rest_ports = [free_port() for _ in range(size)]
        self.pg_ports = [free_port() for _ in range(size)]
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes: list[subprocess.Popen[bytes] | None] = [None] * size

    def _spawn(self, name: str, *command: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(list(command), user=self.uid, group=self.gid,
                                    extra_groups=[], cwd=self.root, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, database: str) -> str:
        """Every node, the writable one chosen at connect (libpq's multi-host string)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.pg_ports)
        return (f"postgres://postgres:pg@{hosts}/{database}"
                "?target_session_attrs=read-write&connect_timeout=3")

    def node_url(self, node: int, database: str = "postgres") -> str:
        return f"postgres://postgres:pg@127.0.0.1:{self.pg_ports[node]}/{database}"

    def start(self) -> PatroniCluster:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self.etcd = self._spawn(
            "etcd", ETCD, "--name", "e1", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"e1={peer}", "--listen-metrics-urls",
            f"http://127.0.0.1:{free_port()}")
        self._wait(lambda: self._get(f"{client}/health") is not None, 30, "etcd")
        for node in range(self.size):
            self.start_node(node)
            if node == 0:
                self._wait(lambda: self.leader() == 0, 90, "node0 to lead")
        self._wait(lambda: len(self.streaming()) == self.size - 1, 90, "replicas streaming")
        return self

    def start_node(self, node: int) -> None:
        config = self.root / f"patroni{node}.yml"
        config.write_text(_node_config(self, node))
        os.chown(config, self.uid, self.gid)
        self.nodes[node] = self._spawn(f"patroni{node}", PATRONI, str(config))

    def _get(self, url: str) -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                body = answer.read()
                return json.loads(body) if body.startswith(b"{") else {}
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def leader(self) -> int | None:
        """The node whose PostgreSQL is the writable primary (Patroni's /primary: 200)."""
        for node, port in enumerate(self.rest_ports):
            if self.nodes[node] is not None and self._get(
                    f"http://127.0.0.1:{port}/primary") is not None:
                return node
        return None

    def streaming(self) -> list[str]:
        leader = self.leader()
        if leader is None:
            return []
        status = self._get(f"http://127.0.0.1:{self.rest_ports[leader]}/patroni") or {}
        replication = status.get("replication") or []
        assert isinstance(replication, list)
        return [r["application_name"] for r in replication if r.get("state") == "streaming"
                and str(r["application_name"]).startswith("node")]  # not pg_basebackup

    def sql(self, node: int, statement: str, database: str = "postgres") -> str:
        result = subprocess.run(["psql", "-X", "-Atc", statement, self.node_url(node, database)],
                                check=True, capture_output=True, text=True)
        return result.stdout

    def kill(self, node: int) -> None:
        """A dead machine: Patroni and its PostgreSQL killed at once (kill -9)."""
        process = self.nodes[node]
        assert process is not None
        postmaster = Path(self.root / f"pg{node}" / "postmaster.pid")
        pid = int(postmaster.read_text().split()[0]) if postmaster.exists() else None
        process.send_signal(signal.SIGKILL)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(30)
        self.nodes[node] = None

    @staticmethod
    def _wait(condition: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Every process this cluster started, by its id (its PostgreSQLs with their
        Patroni's process group)."""
        for node, process in enumerate(self.nodes):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
            postmaster = self.root / f"pg{node}" / "postmaster.pid"
            if postmaster.exists():  # a PostgreSQL its Patroni left (killed first)
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(postmaster.read_text().split()[0]), signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.send_signal(signal.SIGTERM)
            self.etcd.wait(30)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def own_patroni(size: int = 2, synchronous: bool = False) -> Iterator[PatroniCluster]:
    cluster = PatroniCluster(size, synchronous)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)

"""Database servers a test starts itself (never the shared one's configuration), and a
TCP forwarder that plays the address applications use during a failover."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

MARIADBD = "/usr/sbin/mariadbd"
#: Debian's PostgreSQL 15 binaries (initdb and postgres refuse to run as root: the
#: server of a test runs as the postgres user)
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def can_start_mariadb() -> bool:
    return (os.path.exists(MARIADBD) and shutil.which("mariadb-install-db") is not None
            and os.geteuid() == 0)


class MariaDB:
    """A mariadbd of the test's own: its own data directory, port and socket."""

    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.port = free_port()
        self.extra: tuple[str, ...] = extra
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def start(self) -> MariaDB:
        data = self.root / "data"
        if not data.exists():
            subprocess.run(["mariadb-install-db", "--no-defaults", "--user=root",
                            f"--datadir={data}", "--auth-root-authentication-method=normal",
                            "--skip-test-db"], check=True, capture_output=True)
        self.process = subprocess.Popen(
            [MARIADBD, "--no-defaults", "--user=root", f"--datadir={data}",
             f"--port={self.port}", f"--socket={self.root / 'mysqld.sock'}",
             "--bind-address=127.0.0.1", f"--pid-file={self.root / 'mysqld.pid'}",
             f"--log-error={self.root / 'error.log'}", "--skip-name-resolve",
             "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
             "--innodb-buffer-pool-size=64M", "--default-time-zone=+00:00",
             f"--server-id={self.port}", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mariadbd did not start: "
                                   + (self.root / "error.log").read_text()[-2000:])
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        return subprocess.run(["mysqladmin", "--no-defaults", "--user=root",
                               "--host=127.0.0.1", f"--port={self.port}", "ping"],
                              capture_output=True).returncode == 0

    def sql(self, statement: str, database: str = "") -> str:
        result = subprocess.run(["mariadb", "--no-defaults", "--user=root", "--host=127.0.0.1",
                                 f"--port={self.port}", "-N", "-e", statement, database],
                                check=True, capture_output=True, text=True)
        return result.stdout

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(60)

    def restart(self) -> float:
        """A clean shutdown (SIGTERM, as ``mysqladmin shutdown``), then start again on the
        same data and port; returns how long the server was away."""
        started = time.monotonic()
        self.stop(signal.SIGTERM)
        self.start()
        return time.monotonic() - started


def can_start_postgresql() -> bool:
    if not (PG_BIN / "initdb").exists() or os.geteuid() != 0:
        return False
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return True


class PostgreSQL:
    """A postgres of the test's own, never the shared cluster: its own data directory
    (in a directory the postgres user owns: a test's tmp_path is root's alone), port and
    socket directory."""

    def __init__(self) -> None:
        import pwd

        account = pwd.getpwnam("postgres")
        self.uid, self.gid = account.pw_uid, account.pw_gid
        self.root = Path(tempfile.mkdtemp(prefix="sqlqueue-postgres-"))
        os.chown(self.root, self.uid, self.gid)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _as_postgres(self, *command: str | Path, **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(c) for c in command], user=self.uid, group=self.gid,
                                extra_groups=[], cwd=self.root,  # type: ignore[call-overload]
                                **kwargs)

    def start(self) -> PostgreSQL:
        data = self.root / "data"
        if not data.exists():
            init = self._as_postgres(PG_BIN / "initdb", "-D", data, "-U", "postgres",
                                     "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8",
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, error = init.communicate(timeout=120)
            if init.returncode:
                raise RuntimeError(f"initdb failed: {error.decode()[-2000:]}")
        with open(self.root / "server.log", "ab") as log:  # the server keeps its own copy
            self.process = self._as_postgres(
                PG_BIN / "postgres", "-D", data, "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={self.root}",
                "-c", "fsync=off", "-c", "shared_buffers=32MB", "-c", "max_connections=50",
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("postgres did not start: "
                                   + (self.root / "server.log").read_text()[-2000:])
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        return subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1",
                               "-p", str(self.port)], capture_output=True).returncode == 0

    def sql(self, statement: str, database: str = "postgres") -> str:
        result = subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(self.port),
                                 "-U", "postgres", "-d", database, "-Atc", statement],
                                check=True, capture_output=True, text=True)
        return result.stdout

    def create_database(self, database: str) -> None:
        self.sql(f'CREATE DATABASE "{database}" ENCODING \'UTF8\'')

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for every client to
        disconnect, and the subscribers never do)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(60)

    def restart(self) -> float:
        started = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - started

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def own_postgresql() -> Iterator[PostgreSQL]:
    server = PostgreSQL().start()
    try:
        yield server
    finally:
        server.remove()


PGBOUNCER = "/usr/sbin/pgbouncer"


def can_start_pgbouncer() -> bool:
    return os.path.exists(PGBOUNCER) and can_start_postgresql()


class PgBouncer:
    """A PgBouncer of the test's own in front of ``postgres`` (every database), in
    ``pool_mode``, with at most ``pool_size`` server connections per database and user:
    fewer than its clients, so that they take turns on the same server sessions. It runs
    as the postgres user (PgBouncer refuses root), with trust authentication."""

    def __init__(self, postgres: PostgreSQL, pool_mode: str, pool_size: int,
                 via_socket: bool = False) -> None:
        """``via_socket``: reach PostgreSQL through its Unix socket, not TCP."""
        self.postgres = postgres
        self.root = Path(tempfile.mkdtemp(prefix="sqlqueue-pgbouncer-"))
        os.chown(self.root, postgres.uid, postgres.gid)
        self.port = free_port()
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={postgres.root if via_socket else '127.0.0.1'} port={postgres.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n")
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PgBouncer:
        self.process = subprocess.Popen(
            [PGBOUNCER, str(self.root / "pgbouncer.ini")], user=self.postgres.uid,
            group=self.postgres.gid, extra_groups=[], cwd=self.root,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start: " + self.log()[-2000:])
            time.sleep(0.1)

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def remove(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def own_pgbouncer(postgres: PostgreSQL, pool_mode: str = "transaction",
                  pool_size: int = 3, via_socket: bool = False) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(postgres, pool_mode, pool_size, via_socket).start()
    try:
        yield bouncer
    finally:
        bouncer.remove()


class Forwarder:
    """127.0.0.1:<port> relayed to a backend port; ``switch`` points it elsewhere and cuts
    the connections it relays (a failover behind a virtual IP or a proxy)."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.backend))
            except OSError:
                client.close()
                continue
            with self._lock:
                closing = self._closed  # close() ran while this one was being connected
                if not closing:
                    self._open += [client, server]
            if closing:
                client.close()
                server.close()
                return
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def switch(self, backend: int) -> None:
        self.backend = backend
        with self._lock:
            relayed, self._open = self._open, []
        for end in relayed:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.listener.close()
        self.switch(self.backend)


@contextlib.contextmanager
def own_mariadb(root: Path, *extra: str) -> Iterator[MariaDB]:
    server = MariaDB(root, *extra).start()
    try:
        yield server
    finally:
        server.stop()


def manage(url: str, *args: str) -> str:
    """``manage.py <args>`` of the test project against ``url``; returns its output."""
    from tests.acceptance.processes import ROOT

    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, check=True, text=True,
        capture_output=True,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": os.environ.get("PATH", ""),
             "DATABASE_URL": url})
    return result.stdout


def migrated(server: MariaDB | PostgreSQL, database: str) -> str:
    """Create ``database`` on ``server`` with every migration applied; returns its URL."""
    if isinstance(server, PostgreSQL):
        server.create_database(database)
    else:
        server.sql(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    url = server.url(database)
    manage(url, "migrate", "-v", "0")
    return url


GALERA_PROVIDER = "/usr/lib/galera/libgalera_smm.so"


def can_start_galera() -> bool:
    return can_start_mariadb() and os.path.exists(GALERA_PROVIDER)


class GaleraCluster:
    """Three MariaDB Galera nodes of the test's own, on free localhost ports.

    State transfer by rsync fails as root (the joiner's rsync daemon runs as nobody), so
    the nodes never need one: node 1 is bootstrapped alone, given the database, shut down
    cleanly, and its data directory copied to nodes 2 and 3, which then join by IST
    (docs: ../shared/research/wave2-topologies.md, "Setup B")."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.gcomm = [free_port() for _ in range(size)]
        self.ist = [free_port() for _ in range(size)]
        self.sst = [free_port() for _ in range(size)]
        self.nodes = [MariaDB(root / f"g{n + 1}", *self._wsrep(n)) for n in range(size)]

    def _wsrep(self, n: int) -> list[str]:
        members = ",".join(f"127.0.0.1:{port}" for port in self.gcomm)
        return [
            "--wsrep-on=ON", f"--wsrep-provider={GALERA_PROVIDER}",
            "--wsrep-cluster-name=sqlqueue-test", f"--wsrep-node-name=g{n + 1}",
            f"--wsrep-cluster-address=gcomm://{members}",
            f"--wsrep-node-address=127.0.0.1:{self.gcomm[n]}",
            f"--wsrep-provider-options=base_port={self.gcomm[n]};"
            f"ist.recv_addr=127.0.0.1:{self.ist[n]};gcache.size=64M",
            "--wsrep-sst-method=rsync", f"--wsrep-sst-receive-address=127.0.0.1:{self.sst[n]}",
            "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
            "--innodb-flush-log-at-trx-commit=2", "--max-connections=200",
        ]

    def start(self, database: str) -> GaleraCluster:
        """Bootstrap node 1 with ``database`` migrated, then the others as copies."""
        first = self.nodes[0]
        first.extra = (*first.extra, "--wsrep-new-cluster")
        first.start()
        migrated(first, database)
        first.stop(signal.SIGTERM)  # clean: its state says it may bootstrap again
        for node in self.nodes[1:]:
            node.root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(first.root / "data", node.root / "data", symlinks=True)
            with contextlib.suppress(FileNotFoundError):
                (node.root / "data" / "gvwstate.dat").unlink()
            state = node.root / "data" / "grastate.dat"
            state.write_text(state.read_text().replace("safe_to_bootstrap: 1",
                                                       "safe_to_bootstrap: 0"))
            os.chmod(node.root / "data", 0o777)  # IST in bypass mode still rsyncs a marker
        first.start()
        for node in self.nodes[1:]:
            node.start()
        deadline = time.monotonic() + 60
        while self.size() < len(self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster has {self.size()} of {len(self.nodes)} nodes")
            time.sleep(0.2)
        return self

    def size(self) -> int:
        try:
            answer = self.nodes[0].sql("SHOW STATUS LIKE 'wsrep_cluster_size'")
        except subprocess.CalledProcessError:
            return 0
        return int(answer.split()[1]) if answer.strip() else 0

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextlib.contextmanager
def own_galera(root: Path, database: str) -> Iterator[GaleraCluster]:
    cluster = GaleraCluster(root)
    try:
        yield cluster.start(database)
    finally:
        cluster.stop()

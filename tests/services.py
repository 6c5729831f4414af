"""Throwaway servers the conformance suites run against, started for real on loopback.

PostgreSQL comes from Debian's ``postgresql`` package (``make postgresql`` installs it): a fresh
cluster in a temporary folder, ``initdb`` + ``pg_ctl``, listening on 127.0.0.1 at a free port
with ``trust`` authentication for one role, ``fsync=off`` (it is thrown away). PostgreSQL refuses
to run as root, and CI runs as root: then the cluster's folder is handed to the ``postgres``
system user (made by the Debian package; ``nobody`` as a fallback) and every server binary runs
as that user through ``runuser -u``. The folder lives under the system temp dir, not pytest's
``tmp_path``, because pytest's folders are private to root and the server user must enter them.

When the binaries are missing the PostgreSQL half of a suite skips with the reason, except in CI
(``CI=true``), where a missing server is a broken setup and fails.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
PG_ROLE = "rewind"
PG_START_WAIT_S = 120  # pg_ctl -w's own bound; a loaded machine can be slow to start a cluster


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_service(reason: str) -> None:
    """Skip (loudly) outside CI, fail in CI: CI must run every backend."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI=true: every backend must run; see Makefile)")
    pytest.skip(f"SKIPPED BACKEND: {reason}")


def _pg_bin() -> Path | None:
    found = sorted(glob.glob(PG_BIN_GLOB), key=lambda p: int(Path(p).parent.name or 0))
    for folder in reversed(found):
        if Path(folder, "initdb").is_file() and Path(folder, "pg_ctl").is_file():
            return Path(folder)
    return None


def _server_user() -> str | None:
    """The user the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    missing_service("running as root and neither a 'postgres' nor a 'nobody' user exists")
    return None


@dataclass
class PostgresServer:
    """A running throwaway PostgreSQL cluster; :meth:`new_database` gives each test its own.

    :meth:`new_store_database` gives a test a database that already holds an empty store at the
    newest schema revision: a copy (``CREATE DATABASE ... TEMPLATE``, a file copy inside the
    server, ~0.1 s) of one database this session migrated with Alembic the first time one was
    asked for (Alembic on a new PostgreSQL database: ~1 s, paid once per session instead of once
    per test). Tests about migrating a new database use :meth:`new_database`.
    """

    port: int
    admin_url: str
    _store_template: str | None = None

    def url(self, name: str) -> str:
        """The SQLAlchemy URL (``postgresql+psycopg://``) of database ``name`` on this server."""
        return f"postgresql+psycopg://{PG_ROLE}@127.0.0.1:{self.port}/{name}"

    def new_database(self, template: str | None = None) -> str:
        """Create an empty database (or a copy of database ``template``, which nobody may be
        connected to); returns its SQLAlchemy URL."""
        from sqlalchemy import create_engine

        name = f"t_{uuid.uuid4().hex[:16]}"
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                copy = ""
                if template:
                    copy = f' TEMPLATE "{template}"'
                    version = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
                    if version >= 150000:  # a file copy: ~15 ms for a small database
                        copy += " STRATEGY = FILE_COPY"
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"{copy}')
        finally:
            engine.dispose()
        return self.url(name)

    def new_store_database(self) -> str:
        """Create a database holding an empty Rewind store at the newest schema revision (what
        ``open_store`` makes of an empty database); returns its SQLAlchemy URL."""
        if self._store_template is None:
            from rewind.store import open_store

            url = self.new_database()
            scratch = Path(tempfile.mkdtemp(prefix="rewind-pg-template-"))
            try:
                open_store(url, root=scratch).close()  # runs every migration; disconnects
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self._store_template = url.rsplit("/", 1)[1]
        return self.new_database(template=self._store_template)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """Start a PostgreSQL cluster for the test session and stop it (and delete it) at the end."""
    pg_bin = _pg_bin()
    if pg_bin is None:
        missing_service(f"no PostgreSQL binaries in {PG_BIN_GLOB} (make postgresql installs them)")
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        missing_service("psycopg is not installed (pip install 'rewind-replay[postgres]')")
    user = _server_user()
    folder = Path(tempfile.mkdtemp(prefix="rewind-pg-"))
    data, log = folder / "data", folder / "server.log"
    as_user = ["runuser", "-u", user, "--"] if user else []
    if user:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    port = free_port()

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True, cwd=folder)

    try:
        run(str(pg_bin / "initdb"), "-D", str(data), "-U", PG_ROLE, "--auth=trust", "-E", "UTF8")
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            # No replicas: minimal WAL. CREATE DATABASE (one per test) then takes ~20-45 ms
            # instead of ~300 ms (it WAL-logs every block of the ~7.5 MB template otherwise).
            " -c wal_level=minimal -c max_wal_senders=0"
        )
        run(
            str(pg_bin / "pg_ctl"), "start", "-w", "-t", str(PG_START_WAIT_S),
            "-D", str(data), "-l", str(log), "-o", options,
        )  # fmt: skip
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip()
        server_log = log.read_text(errors="replace") if log.exists() else ""
        shutil.rmtree(folder, ignore_errors=True)
        pytest.fail(f"cannot start PostgreSQL: {detail}\n{server_log}")
    try:
        yield PostgresServer(
            port=port, admin_url=f"postgresql+psycopg://{PG_ROLE}@127.0.0.1:{port}/postgres"
        )
    finally:
        subprocess.run(
            [*as_user, str(pg_bin / "pg_ctl"), "stop", "-m", "fast", "-D", str(data)],
            capture_output=True,
            cwd=folder,
        )
        remove_in_background(folder)


def remove_in_background(folder: Path) -> None:
    """Delete ``folder`` in a process of its own that this one does not wait for.

    A session's PostgreSQL cluster holds a copy of the store template per test (hundreds of MB):
    deleting it after 150 databases took 3.5 s, and 60 s once on the loaded machine (measured
    alone), at the end of a worker's session, that is on the critical path of its last file
    (whose teardown took 10 and 28 s in one loaded whole-suite run). Nothing reads the folder
    once the server has stopped; ``rm`` goes on after pytest has exited.
    """
    _BACKGROUND.append(
        subprocess.Popen(
            ["rm", "-rf", "--", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )


_BACKGROUND: list[subprocess.Popen[bytes]] = []
"""Deletions under way (referenced, so no "still running" warning is raised when collected)."""


@dataclass
class S3Server:
    """A running moto S3 server on loopback; :meth:`new_bucket` gives each test its own."""

    endpoint_url: str

    @property
    def storage_options(self) -> dict[str, object]:
        """s3fs options that point at this server (never at AWS)."""
        return {
            "key": "rewind-test",
            "secret": "rewind-test",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }

    def new_bucket(self) -> str:
        """Create an empty bucket; returns its name."""
        import boto3

        name = f"t-{uuid.uuid4().hex[:16]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="rewind-test",
            aws_secret_access_key="rewind-test",
        )
        client.create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3-compatible HTTP server on 127.0.0.1 (a free port) for the session.

    Credentials are dummies: moto accepts any, and the endpoint is loopback, so nothing can
    reach AWS even if a test forgets the endpoint (s3fs would then fail to authenticate).
    """
    try:
        from moto.server import ThreadedMotoServer
    except ModuleNotFoundError:
        missing_service("moto[server] is not installed (pip install -e '.[dev]')")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        server.stop()


REDIS_START_WAIT_S = 60  # a bound on waiting for a hung start, not a speed requirement


@dataclass
class RedisServer:
    """A running throwaway Redis server on loopback; :meth:`new_url` gives each test its own
    database (0–15), so one test's queued jobs never reach another test's workers."""

    port: int
    _next_db: int = 0

    def new_url(self) -> str:
        """A ``redis://`` URL of a database no other test of the session used (flushed)."""
        import redis

        db = self._next_db % 16
        self._next_db += 1
        client = redis.Redis(host="127.0.0.1", port=self.port, db=db)
        client.flushdb()
        client.close()
        return f"redis://127.0.0.1:{self.port}/{db}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """Start Debian's ``redis-server`` (``make redis`` installs it) on 127.0.0.1 at a free port,
    without persistence, for the test session; stop it at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing_service("no redis-server binary (make redis installs Debian's redis-server)")
    try:
        import redis
    except ModuleNotFoundError:
        missing_service("the redis client is not installed (pip install -e '.[dev]')")
    folder = Path(tempfile.mkdtemp(prefix="rewind-redis-"))
    port = free_port()
    command = [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    command += ["--appendonly", "no", "--dir", str(folder), "--protected-mode", "yes"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    try:
        for _ in range(REDIS_START_WAIT_S * 10):
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited at start with status {proc.returncode}")
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.1)
        else:
            pytest.fail(f"redis-server did not answer on port {port}")
        yield RedisServer(port=port)
    finally:
        client.close()
        proc.terminate()
        reap(proc, 30)
        shutil.rmtree(folder, ignore_errors=True)


def reap(proc: subprocess.Popen[bytes], wait_s: float = 60) -> None:
    """Wait for ``proc`` (already told to stop) to exit; kill it after ``wait_s`` seconds."""
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

"""A throwaway PostgreSQL server for tests: Debian's `postgresql` binaries, a private cluster on 127.0.0.1."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from helpers.loopback import free_port

PG_USER = "narwhal_team"
PG_DB = "narwhal_dagster"  # the README's db_name


@dataclass(frozen=True)
class PgServer:
    """A running cluster: `env` holds the README's NARWHAL_DAGSTER_PG_* variables for PG_USER."""

    bindir: Path
    port: int
    admin: str
    admin_password: str
    password: str

    @property
    def env(self) -> dict[str, str]:
        return {"NARWHAL_DAGSTER_PG_USER": PG_USER, "NARWHAL_DAGSTER_PG_PASSWORD": self.password,
                "NARWHAL_DAGSTER_PG_HOST": "127.0.0.1", "NARWHAL_DAGSTER_PG_PORT": str(self.port)}  # fmt: skip

    def dump(self) -> str:
        """The whole database as SQL text (pg_dump), for scanning what Dagster stored."""
        env = {**os.environ, "PGPASSWORD": self.admin_password}
        args = [str(self.bindir / "pg_dump"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.admin, PG_DB]
        return subprocess.run(args, env=env, check=True, capture_output=True, text=True, timeout=120).stdout


def postgres_bindir() -> Path | None:
    """Debian's newest /usr/lib/postgresql/<major>/bin (package `postgresql`), if installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def server_user() -> str | None:
    """PostgreSQL refuses to run as root: root runs it as Debian's `postgres` account."""
    return "postgres" if os.geteuid() == 0 else None


def require_postgres() -> Path:
    """Debian's server binaries and (for root) its `postgres` account; skip without them, fail under CI."""
    bindir = postgres_bindir()
    problem = "Debian package postgresql (/usr/lib/postgresql/*/bin/initdb)" if bindir is None else None
    if bindir is not None and server_user() is not None:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            problem = "the `postgres` account (Debian package postgresql)"
    if bindir is not None and problem is None:
        return bindir
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL unavailable, missing {problem} (CI is set: must run, not skip)", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable, missing {problem}")


@contextmanager
def running_server() -> Iterator[PgServer]:
    """initdb + pg_ctl start in a private temp dir (its Unix socket there too), a login role and the README's
    database; `pg_ctl stop` and the directory removed afterwards."""
    bindir = require_postgres()
    user = server_user()
    as_server = {"user": user, "group": user, "extra_groups": []} if user else {}

    def pg(*args: str) -> None:
        subprocess.run([str(bindir / args[0]), *args[1:]], check=True, capture_output=True, timeout=120, **as_server)

    workdir = Path(tempfile.mkdtemp(prefix="narwhal-pg-"))
    data, log, pwfile, port = workdir / "data", workdir / "server.log", workdir / "admin.pw", free_port()
    server = PgServer(bindir, port, "narwhal_admin", secrets.token_urlsafe(24), secrets.token_urlsafe(24))
    try:
        pwfile.write_text(server.admin_password + "\n", encoding="utf-8")
        pwfile.chmod(0o600)
        for path in (workdir, pwfile):
            if user is not None:
                shutil.chown(path, user, user)
        pg("initdb", "-D", str(data), "-U", server.admin, f"--pwfile={pwfile}", "--auth=scram-sha-256",
           "-E", "UTF8", "--no-locale")  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {workdir} -c fsync=off"
        try:
            pg("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
        except subprocess.CalledProcessError:
            pytest.fail("PostgreSQL did not start:\n" + log.read_text(encoding="utf-8", errors="replace")[-2000:])
        try:
            create_team_database(server)
            yield server
        finally:
            pg("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(workdir)


def create_team_database(server: PgServer) -> None:
    """The login role of the README's env variables, owning the README's database."""
    connection = psycopg2.connect(host="127.0.0.1", port=server.port, user=server.admin,
                                  password=server.admin_password, dbname="postgres")  # fmt: skip
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {PG_USER} LOGIN PASSWORD %s", (server.password,))
            cursor.execute(f"CREATE DATABASE {PG_DB} OWNER {PG_USER}")
    finally:
        connection.close()

"""A PostgreSQL server for tests: Debian's `postgresql` binaries (scripts/install.sh), its
own data folder under a temporary one, listening on 127.0.0.1 only, started and stopped
with bounded waits. The server refuses to run as root, so under root it runs as the
`postgres` user the package created."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from airflow_backfill.loopback import free_port

START_TIMEOUT_S = 60
DATABASE = "airflow"
USER = "airflow"


@dataclass(frozen=True)
class PostgresServer:
    port: int
    folder: str
    """The server's own folder (its data and sockets)."""

    def postmaster_pid(self) -> int | None:
        """The server's main process (its other processes are its children)."""
        try:
            return int((Path(self.folder) / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{DATABASE}"


def server_binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder (initdb, pg_ctl), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(path.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """initdb (trust authentication for the `airflow` superuser) in a new temporary folder
    (directly under the system's temporary folder, which the server's user can reach),
    start on a free loopback port, create the `airflow` database; stop (fast shutdown) and
    remove the folder at the end."""
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed; run scripts/install.sh (Debian's postgresql package).")
    folder = Path(tempfile.mkdtemp(prefix="airflow_backfill-postgres-"))
    data, sockets = folder / "data", folder / "sockets"
    data.mkdir()
    sockets.mkdir()
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (folder, data, sockets):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    run = {"check": True, "capture_output": True, "text": True}
    subprocess.run(_as_server_user([str(binaries / "initdb"), "-D", str(data), "-U", USER, "--auth=trust",
                                    "--encoding=UTF8", "--no-sync"]), timeout=120, **run)  # type: ignore[call-overload]
    port = free_port()
    options = f"-h 127.0.0.1 -p {port} -k {sockets} -c fsync=off -c max_connections=200"
    subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                    str(folder / "server.log"), "-w", "-t", str(START_TIMEOUT_S), "start"]),
                   timeout=START_TIMEOUT_S + 30, **run)  # type: ignore[call-overload]
    try:
        subprocess.run([str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE],
                       timeout=60, **run)  # type: ignore[call-overload]
        yield PostgresServer(port, str(folder))
    finally:
        subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30",
                                        "stop"]), timeout=60, capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)

"""A throwaway PostgreSQL server for the SQL tests.

``MIXLE_TEST_POSTGRES_URL`` (a SQLAlchemy URL) names a server to use. Otherwise, when the
``initdb`` and ``pg_ctl`` programs exist (Debian: ``apt-get install postgresql``), a cluster
is created in a temporary directory, started on 127.0.0.1 on a free port with ``trust``
authentication, and stopped and deleted at the end. PostgreSQL refuses to run as root, so
as root the cluster belongs to the ``postgres`` user and the programs run through
``runuser``. The reason is returned when no server can be started.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_URL = "MIXLE_TEST_POSTGRES_URL"
START_TIMEOUT_S = 60


@dataclass
class Server:
    """A running server's SQLAlchemy URL, or why there is none."""

    url: str | None
    reason: str = ""


def _binaries() -> str | None:
    """The folder holding ``initdb`` and ``pg_ctl``: on ``PATH`` or Debian's versioned dir."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(found)
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(folder, "initdb")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _runner() -> tuple[list[str], str | None]:
    """The command prefix that runs PostgreSQL's programs as a non-root user, or why not.

    Not root: no prefix. Root: ``runuser -u postgres --`` (or ``su postgres -c``).
    """
    if os.geteuid() != 0:
        return [], None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return [], "running as root and there is no 'postgres' user to run the server as"
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"], None
    if shutil.which("su"):
        return ["su", "postgres", "-s", "/bin/sh", "-c"], None
    return [], "running as root and neither runuser nor su is available"


@contextlib.contextmanager
def postgres_server() -> Iterator[Server]:
    """Yield a :class:`Server`; a server started here is stopped and deleted afterwards."""
    if os.environ.get(ENV_URL):
        yield Server(os.environ[ENV_URL])
        return
    folder = _binaries()
    if folder is None:
        yield Server(
            None, "PostgreSQL is not installed (no initdb/pg_ctl; apt-get install postgresql)"
        )
        return
    prefix, problem = _runner()
    if problem is not None:
        yield Server(None, problem)
        return
    root = tempfile.mkdtemp(prefix="mixle-pg-")
    os.chmod(root, 0o755)
    data, log = os.path.join(root, "data"), os.path.join(root, "log")
    if prefix:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*prefix, shlex.join(args)] if prefix[:1] == ["su"] else [*prefix, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    port = _free_port()
    started = False
    try:
        init = run(
            os.path.join(folder, "initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        if init.returncode:
            yield Server(None, f"initdb failed: {init.stderr.strip()[-500:]}")
            return
        options = f"-h 127.0.0.1 -p {port} -k {root} -F"
        start = run(
            os.path.join(folder, "pg_ctl"),
            "-D",
            data,
            "-l",
            log,
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )
        if start.returncode:
            text = Path(log).read_text()[-500:] if os.path.exists(log) else start.stderr
            yield Server(None, f"pg_ctl start failed: {text.strip()}")
            return
        started = True
        yield Server(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres")
    finally:
        if started:
            run(os.path.join(folder, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)

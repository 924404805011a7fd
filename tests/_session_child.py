"""A Python child process in its own session, killed with everything it started afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def session_child(args: list[str], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``python *args`` with stdout piped and stderr in ``tmp_path/child-stderr.txt``.

    On exit the child is killed if it still runs, and so is its whole session (worker
    processes it left behind).
    """
    with open(tmp_path / "child-stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

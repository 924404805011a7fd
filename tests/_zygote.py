"""Child interpreters forked from one that has done its imports once: a fresh interpreter
spends most of a second importing numpy, zarr, h5py and mixle before a test's child starts.

A :class:`Zygote` is a Python process that imports ``preload`` and then forks one child per
job. The child takes the job's environment, working directory, ``sys.argv`` and
``sys.path[0]``, reads ``/dev/null`` and writes its stdout and stderr to files, then runs
the job's code as ``__main__``; it leaves through the interpreter's own shutdown (atexit
handlers, flushed streams; the status of ``SystemExit``, or 1 and a traceback for an
uncaught exception), so it behaves as ``python -c code`` or ``python script`` would.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: The zygote: ``preload`` is argv[1]; one JSON job a line on stdin; for each it answers
#: the child's pid, then its exit status (negative: the signal that killed it).
_SERVER = """
import json, os, sys
exec(sys.argv[1])
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
else:
    raise SystemExit(0)
del line, pid
os.environ.clear()
os.environ.update(job["env"])
os.chdir(job["cwd"])
for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["out"], os.O_WRONLY),
                        (2, job["err"], os.O_WRONLY)):
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)
import tempfile
tempfile.tempdir = None  # found again from this job's TMPDIR
sys.argv = job["argv"]
if job["path0"] is None:
    del sys.path[0]
else:
    sys.path[0] = job["path0"]
code, name, job = job["code"], job["name"], None
exec(compile(code, name, "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass
class Finished:
    """A child's exit status (``None``: killed after ``timeout``), stdout and stderr."""

    status: int | None
    stdout: str
    stderr: str


class Zygote:
    """A forking interpreter that imported ``preload`` once, started at its first job.

    ``env`` and ``cwd`` are the zygote's own (what its imports see); each job brings its
    own. Call :meth:`close` when done (a module-scoped fixture).
    """

    def __init__(self, preload: str, env: dict[str, str], cwd: Path) -> None:
        self._preload, self._env, self._cwd = preload, env, cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""

    def _line(self, timeout: float) -> str | None:
        """The zygote's next answer line, or ``None`` if none comes within ``timeout``."""
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._proc.stdout], [], [], left)[0]:
                return None
            more = os.read(self._proc.stdout.fileno(), 4096)
            assert more, f"the zygote exited with status {self._proc.wait()}"
            self._pending += more
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def run(
        self,
        code: str,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path | str,
        timeout: float,
        path0: str | None = "",
        name: str = "<string>",
    ) -> Finished:
        """Run ``code`` in a forked child; a child past ``timeout`` seconds is killed.

        ``argv`` is its ``sys.argv``; ``path0`` its ``sys.path[0]`` (``""`` as for
        ``python -c``, ``None``: removed); ``name`` the file name its tracebacks show.
        """
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, self._preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                env=self._env,
                cwd=self._cwd,
            )
            self._pending = b""
        assert self._proc.stdin is not None
        with tempfile.TemporaryDirectory() as streams:
            out, err = Path(streams, "out"), Path(streams, "err")
            out.touch()
            err.touch()
            job = {
                "code": code,
                "name": name,
                "argv": argv,
                "path0": path0,
                "env": env,
                "cwd": str(cwd),
                "out": str(out),
                "err": str(err),
            }
            self._proc.stdin.write((json.dumps(job) + "\n").encode())
            pid = self._line(timeout)
            assert pid is not None, "the zygote did not fork"
            status = self._line(timeout)
            if status is None:
                os.kill(int(pid), signal.SIGKILL)
                self._line(timeout)
            return Finished(
                None if status is None else int(status), out.read_text(), err.read_text()
            )

    def close(self) -> None:
        """End the zygote (its loop ends when its stdin closes)."""
        if self._proc is not None:
            self._proc.communicate(timeout=60)
            self._proc = None

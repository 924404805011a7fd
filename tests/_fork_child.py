"""Run a check in a forked child and get its problems back (the fork tests of the sources)."""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections.abc import Callable


def in_forked_child(body: Callable[[], list[str]]) -> list[str]:
    """Run ``body`` in a forked child; its problems, or why the child gave none back.

    The child has 10 s (``SIGALRM``): a deadlocked child ends instead of hanging the suite.
    """
    r, w = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns when a process with threads forks
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        problems = ["the child raised"]
        try:
            os.close(r)
            signal.alarm(10)
            problems = body()
        except BaseException as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        finally:
            os.write(w, json.dumps(problems[:5]).encode())
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return [f"the child gave no answer (exit status {status})"]
    return list(json.loads(b"".join(chunks)))

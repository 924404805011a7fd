"""Process measurements the benchmarks share: peak RSS, private bytes, children, and one
measurement run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["children", "private_bytes", "run_measurement", "vm_hwm"]


def run_measurement(
    script: str, args: list[str], what: str, timeout: float = 600
) -> dict[str, Any]:
    """Run ``python script *args`` in a fresh interpreter: the JSON row its last line prints.

    Raises ``RuntimeError`` naming ``what``, with the end of its stderr, when it fails.
    """
    out = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def vm_hwm() -> int:
    """Peak resident set of this process in bytes (VmHWM; never ru_maxrss)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def private_bytes(pid: int) -> int:
    """Private_Clean + Private_Dirty of process ``pid`` (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0
    fields = {line.split(":")[0]: line.split()[1] for line in lines if ":" in line}
    return (int(fields.get("Private_Clean", 0)) + int(fields.get("Private_Dirty", 0))) * 1024


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found

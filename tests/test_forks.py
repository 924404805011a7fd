"""ForkLock: a lock a parent thread holds at fork time is free in the child."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from mixle.utils.forks import ForkLock

LOCK = ForkLock()
RLOCK = ForkLock(reentrant=True)


def _take_both() -> None:
    with LOCK, RLOCK, RLOCK:  # reentrant: taken twice by one thread
        os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_lock_held_by_a_parent_thread_at_the_fork_is_free_in_the_child() -> None:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with LOCK, RLOCK:
            held.set()
            done.wait(timeout=60)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(timeout=60)
    try:
        child = multiprocessing.get_context("fork").Process(target=_take_both)
        child.start()
        child.join(timeout=60)  # only catches a hang
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0
    finally:
        done.set()
        thread.join(timeout=60)
    with LOCK:  # the parent's lock is still a working lock
        pass

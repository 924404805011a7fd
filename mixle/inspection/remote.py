"""Remote stores for ``mixle inspect``: request timeouts, one deadline, keys, clean warnings.

Every file system inspect makes for a URL gets the request timeout of
:func:`~mixle.reading.policy.retry_policy` (:func:`timed_options`), the whole inspection of
a URL ends by the policy's deadline (:func:`within_deadline`), object keys below a URL go
into its path, before any query string (:func:`child_url`), and warnings raised while
inspecting are re-emitted with credentials masked (:func:`redacted_warnings`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from mixle.inspection.limits import MAX_METADATA_BYTES, parse_metadata
from mixle.inspection.locations import url_fs
from mixle.reading.faults import RemoteTimeoutError
from mixle.reading.fs_options import timed_storage_options
from mixle.reading.policy import retry_policy
from mixle.utils.redact import display_path, redact_text

__all__ = [
    "check_remote_metadata",
    "child_url",
    "give_up_if_late",
    "redacted_warnings",
    "timed_options",
    "within_deadline",
]

T = TypeVar("T")
#: Metadata files at the root of a zarr store (checked when zarr cannot open the store).
_ROOT_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
#: Per thread: the ``time.monotonic()`` by which the inspection running there must end.
_LATE = threading.local()


def timed_options(location: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` for ``location`` plus the retry policy's request timeout.

    :func:`mixle.reading.fs_options.timed_storage_options` (the one helper opening a zarr uses
    too): HTTP(S) sessions and S3 botocore clients get the timeout unless the user set one.
    """
    return timed_storage_options(location, storage_options)


def child_url(base: str, name: str) -> str:
    """The key ``name`` below ``base`` (a URL or a file system path), before any query.

    ``child_url("http://h/v.h5?token=x", "zarr.json")`` is
    ``"http://h/v.h5/zarr.json?token=x"``: the query string stays at the end, where a
    server reads it, instead of swallowing the key.
    """
    parts = urllib.parse.urlsplit(base)
    if not parts.query and not parts.fragment:
        return f"{base.rstrip('/')}/{name}"
    path = f"{parts.path.rstrip('/')}/{name}"
    return urllib.parse.urlunsplit(parts._replace(path=path, fragment=""))


def check_remote_metadata(location: str, storage_options: dict[str, Any] | None) -> None:
    """Raise for the first metadata file at the root of the store at ``location`` that is bad.

    Called when zarr cannot open the store, to name the file at fault: each of zarr.json,
    .zarray, .zgroup and .zattrs that exists is read (at most :data:`MAX_METADATA_BYTES`)
    and checked by :func:`~mixle.inspection.limits.parse_metadata`. Files that cannot be
    read are skipped (the caller reports zarr's own error then).

    Raises
    ------
    InvalidMetadataError
        For a file that is not a JSON object, naming it (display-safe).
    """
    fs, path = url_fs(location, storage_options)
    for name in _ROOT_METADATA:
        key = child_url(path, name)
        try:
            data = fs.cat_file(key, start=0, end=MAX_METADATA_BYTES)
        except Exception:  # missing, or failing: not the file to blame
            continue
        parse_metadata(bytes(data), display_path(child_url(location, name)))


def give_up_if_late(url: str) -> None:
    """Raise :class:`RemoteTimeoutError` if the inspection in this thread is past its deadline.

    Called before each try of a retried step, so that an inspection :func:`within_deadline`
    gave up on stops at its next try instead of retrying in the background.
    """
    end = getattr(_LATE, "end", None)
    if end is not None and time.monotonic() >= end:
        raise RemoteTimeoutError(_late_message(url))


def within_deadline(call: Callable[[], T], url: str) -> T:
    """``call()``, given up after the retry policy's deadline with :class:`RemoteTimeoutError`.

    ``call`` runs in a daemon thread of its own; the caller waits at most
    :attr:`~mixle.reading.policy.RetryPolicy.deadline` seconds for it (no limit when that
    is ``math.inf``). A call given up on stops at its next retried step
    (:func:`give_up_if_late`) or when its request times out.

    Raises
    ------
    RemoteTimeoutError
        When ``call`` is not done by the deadline (names ``url``, which must be
        display-safe, and how to change the deadline).
    """
    deadline = retry_policy().deadline
    if deadline == float("inf"):
        return call()
    end = time.monotonic() + deadline
    done: dict[str, Any] = {}

    def run() -> None:
        _LATE.end = end
        try:
            done["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            done["error"] = exc

    worker = threading.Thread(target=run, name="mixle-inspect", daemon=True)
    worker.start()
    worker.join(deadline)
    if worker.is_alive():
        raise RemoteTimeoutError(_late_message(url))
    if "error" in done:
        error = done.pop("error")
        try:
            raise error
        finally:
            del error  # no cycle through this frame
    return done["value"]


def _late_message(url: str) -> str:
    seconds = retry_policy().deadline
    return (
        f"inspecting {url} gave up: no answer within the {seconds:g} s deadline (request "
        f"timeout {retry_policy().timeout:g} s; mixle inspect --timeout/--deadline or "
        "mixle.reading.set_retry_policy(timeout=..., deadline=...) change them)"
    )


@contextlib.contextmanager
def redacted_warnings(secrets: object) -> Iterator[None]:
    """Re-emit the warnings raised in the block with URLs and ``secrets`` masked.

    zarr and fsspec warn with the store's repr, whose URL holds the password and query
    string; each warning is caught and warned again, same category, redacted.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield
    for found in caught:
        warnings.warn_explicit(
            redact_text(str(found.message), secrets),
            found.category,
            found.filename,
            found.lineno,
        )

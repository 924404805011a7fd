"""Worker processes for the Loader: batches read in other processes, handed back through
shared memory, in the order one thread reads them.

:class:`~mixle.loading.workers.pool.WorkerPool` is the parent's side,
:func:`~mixle.loading.workers.process.loader_worker_main` the loop each worker runs, and
:mod:`~mixle.loading.workers.slots` the shared-memory hand-off.
"""

from mixle.loading.workers.pool import WorkerPool

__all__ = ["WorkerPool"]

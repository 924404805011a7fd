"""Record and tabular sources: CSV, JSON lines, Parquet, SQL, data frames, memory.

The names of :mod:`mixle.data.sources.records.base` are importable from here too: before
the record family had a folder, ``mixle.data.sources.records`` was that module (its
``_reopen`` too, which pickles of record sources made then name).
"""

from mixle.data.sources.records.base import (
    STREAM_ROWS,
    Batch,
    MemorySource,
    Record,
    RecordSource,
    TableMeta,
)
from mixle.data.sources.records.base import (
    _reopen as _reopen,  # pickles made before the move name records._reopen
)

__all__ = ["STREAM_ROWS", "Batch", "MemorySource", "Record", "RecordSource", "TableMeta"]

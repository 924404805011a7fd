"""Record and tabular sources: CSV, JSON lines, Parquet, SQL, data frames, memory.

The names of :mod:`mixle.data.sources.records.base` are importable from here too: before
the record family had a folder, ``mixle.data.sources.records`` was that module.
"""

from mixle.data.sources.records.base import (
    STREAM_ROWS,
    Batch,
    MemorySource,
    Record,
    RecordSource,
    TableMeta,
)

__all__ = ["STREAM_ROWS", "Batch", "MemorySource", "Record", "RecordSource", "TableMeta"]

"""Record and tabular sources: memory, CSV, JSON lines, Parquet, SQL, data frames, Hugging
Face datasets and ArrayRecord files.

Every source here is lazy and index-addressable: ``len(src)``, ``src[i]`` (a dict of NumPy
scalars), ``src.get_batch(indices)`` (a dict of NumPy columns), ``records()`` and
``iter_batches()`` (streaming with bounded memory), ``element_spec()``, pickling by
reference, ``close()`` and ``with``. They plug into :class:`mixle.Loader`,
:class:`~mixle.utils.parallel.multiprocessing.MPEncodedData` and :func:`mixle.jax.to_jax`.
pyarrow (``mixle[tabular]``) and SQLAlchemy (``mixle[sql]``) are imported only when a
Parquet file or a database URL is opened.
"""

from mixle.data.sources.records.array_record_source import ArrayRecordSource, read_array_record
from mixle.data.sources.records.base import MemorySource, RecordSource
from mixle.data.sources.records.dataframe_source import read_dataframe
from mixle.data.sources.records.hf import HFSource, HFStreamSource, read_hf
from mixle.data.sources.records.parquet_source import ParquetSource, read_parquet
from mixle.data.sources.records.sql.sql_source import SQLSource, read_sql
from mixle.data.sources.records.text.csv_source import CSVSource, read_csv
from mixle.data.sources.records.text.jsonl_source import JSONLSource, read_jsonl
from mixle.data.sources.records.text.row_index import cache_dir

__all__ = [
    "ArrayRecordSource",
    "CSVSource",
    "HFSource",
    "HFStreamSource",
    "JSONLSource",
    "MemorySource",
    "ParquetSource",
    "RecordSource",
    "SQLSource",
    "cache_dir",
    "read_array_record",
    "read_csv",
    "read_dataframe",
    "read_hf",
    "read_jsonl",
    "read_parquet",
    "read_sql",
]

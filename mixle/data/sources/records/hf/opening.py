"""Where a ``datasets`` source comes from: a ``save_to_disk`` folder, a split of a dict.

``datasets`` writes a ``Dataset`` folder as ``state.json`` + ``dataset_info.json`` + Arrow
files, and a ``DatasetDict`` folder as ``dataset_dict.json`` (``{"splits": [...]}``) with one
``Dataset`` folder per split. Only the asked split is opened.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mixle.data.sources.arrays.base import listing
from mixle.errors import SplitNotFoundError
from mixle.utils.files import read_regular_file
from mixle.utils.optional_deps import require

__all__ = ["HF_METADATA_LIMIT", "check_format", "load_saved", "pick_split"]

#: What ``dataset_or_path`` may be, for error messages.
ACCEPTED = (
    "a datasets.Dataset, DatasetDict, IterableDataset or IterableDatasetDict, or the path "
    "of a folder written by Dataset.save_to_disk or DatasetDict.save_to_disk"
)
_DICT_FILE = "dataset_dict.json"
#: The most bytes read of a DatasetDict folder's split list (it names a few splits).
HF_METADATA_LIMIT = 1024 * 1024
_DATASET_FILES = ("state.json", "dataset_info.json")


def pick_split(split: object, splits: list[str], what: str) -> str:
    """The split of a ``DatasetDict`` to read: ``split``, or the only one when it is ``None``.

    Raises
    ------
    TypeError
        ``split`` is not a string or ``None``.
    ValueError
        ``split=None`` with no split or several of them (the message lists them).
    KeyError
        ``split`` is not one of ``splits`` (the message lists them).
    """
    if split is None:
        if len(splits) == 1:
            return splits[0]
        if not splits:
            raise ValueError(f"{what} has no splits, so there is nothing to read")
        raise ValueError(
            f"split=None, but {what} has several splits ({', '.join(map(repr, splits))}); "
            "pass split= one of them"
        )
    if not isinstance(split, str):
        raise TypeError(f"split={split!r} must be a split name (a string) or None")
    if split not in splits:
        raise SplitNotFoundError(
            f"split={split!r}: {what} has no such split; {listing(list(splits), 'its splits')}"
        )
    return split


def load_saved(path: str, split: str | None) -> Any:
    """The ``datasets.Dataset`` saved at ``path`` (split ``split`` of a ``DatasetDict`` folder).

    Memory-maps the Arrow files; reads no rows.

    Raises
    ------
    ValueError
        ``path`` is a URL, or ``split`` is given for a ``Dataset`` folder.
    FileNotFoundError
        Nothing at ``path``, or it is not a folder ``save_to_disk`` wrote (the message says
        what is there).
    KeyError
        ``split`` is not a split of a ``DatasetDict`` folder.
    """
    datasets = require("datasets", feature="read_hf")
    if "://" in path:
        raise ValueError(
            f"dataset_or_path={path!r}: read_hf opens local folders only; load a remote one "
            "with datasets.load_from_disk(url, storage_options=...) and pass the Dataset"
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset_or_path={path!r} does not exist; pass {ACCEPTED}")
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"dataset_or_path={path!r} is a file, not a folder written by save_to_disk; "
            f"pass {ACCEPTED}"
        )
    if os.path.isfile(os.path.join(path, _DICT_FILE)):
        raw = read_regular_file(os.path.join(path, _DICT_FILE), _DICT_FILE, limit=HF_METADATA_LIMIT)
        splits = [str(s) for s in json.loads(raw).get("splits", [])]
        chosen = pick_split(split, splits, f"the DatasetDict folder {path!r}")
        inner = os.path.join(path, chosen)
        if not _is_dataset_folder(inner):
            raise FileNotFoundError(
                f"split={chosen!r}: {inner!r} is not a Dataset folder (no state.json and "
                "dataset_info.json); the DatasetDict folder is incomplete"
            )
        return datasets.Dataset.load_from_disk(inner, keep_in_memory=False)
    if _is_dataset_folder(path):
        if split is not None:
            raise ValueError(
                f"split={split!r}, but {path!r} is a Dataset folder (one split), not a "
                "DatasetDict folder; leave split out"
            )
        return datasets.Dataset.load_from_disk(path, keep_in_memory=False)
    found = sorted(os.listdir(path))
    raise FileNotFoundError(
        f"dataset_or_path={path!r} is a folder, but not one save_to_disk wrote: it has "
        f"neither {_DICT_FILE} (a DatasetDict) nor {' and '.join(_DATASET_FILES)} (a Dataset); "
        f"{listing(found, 'files')}"
    )


def _is_dataset_folder(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, name)) for name in _DATASET_FILES)


def check_format(dataset: Any) -> None:
    """Refuse a dataset with a custom transform (``set_transform``/``with_transform``).

    read_hf reads the Arrow data; a transform would be skipped silently.
    """
    if dataset.format.get("type") == "custom":
        raise ValueError(
            "dataset_or_path has a transform (set_transform/with_transform), which read_hf "
            "would skip (it reads the Arrow data); pass the dataset without it "
            "(ds.with_format(None)) and apply the transform in the Loader (transform=...)"
        )

"""Sharded zarr (format 3) arrays read a shard index once and inner chunks in few requests.

A shard is one stored object holding many inner chunks and, at its end or start, an index
of ``(offset, length)`` pairs (``uint64``, little-endian, ``2**64 - 1`` twice for a chunk
never written) protected by a crc32c checksum. zarr's own reader fetches the index again
for every inner chunk and each inner chunk in its own request; :class:`ShardedZarrReader`
keeps parsed indices (:data:`SHARD_INDEX_CACHE_ENTRIES` of them) and, for a batch, merges
the byte ranges of the inner chunks it needs from one shard into one or a few requests
(:func:`~mixle.reading.fetch.coalesce_ranges`). Every range answer is checked before its
bytes are cut into chunks (:class:`~mixle.data.sources.arrays.zarr.stores.CheckedRangeStore`,
also importable from here): a shifted ``Content-Range``, a short body or an error page
served as data is retried, then raised, never decoded.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Generator, Sequence
from contextlib import closing
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.chunks import Decoder, decode_checked, fill_chunk
from mixle.data.sources.arrays.zarr.outer_shards import shard_layout
from mixle.data.sources.arrays.zarr.stores import CheckedRangeStore, StoreGetter
from mixle.data.sources.arrays.zarr.vlen import VlenLimitError
from mixle.reading import CorruptChunkError, new_token
from mixle.reading.inflight import coalesce_ranges

__all__ = ["SHARD_INDEX_CACHE_ENTRIES", "CheckedRangeStore", "ShardedZarrReader"]

#: Parsed shard indices one reader keeps (a few KiB each), least recently used dropped.
SHARD_INDEX_CACHE_ENTRIES = 4096
#: Marks an inner chunk never written (both offset and length).
_EMPTY = np.uint64(2**64 - 1)
#: Bytes of a crc32c checksum after the index.
_CRC_BYTES = 4


class ShardedZarrReader:
    """Inner chunks of a sharded zarr array, fetched concurrently and decoded with numcodecs.

    Use :meth:`for_array`, which returns ``None`` for layouts zarr must decode itself.

    Attributes
    ----------
    chunks
        Inner chunk shape (the unit of decoding and of the read plan).
    """

    def __init__(
        self,
        array: Any,
        decode: Decoder,
        checksum: bool,
        at_end: bool,
        where: str,
        url: str,
        secrets: Any,
    ) -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._meta = array.metadata
        self._per_shard = tuple(s // c for s, c in zip(array.shards, self.chunks))
        self._decode = decode
        self._checksum = checksum
        self._at_end = at_end
        inner = math.prod(self._per_shard)
        self._index_bytes = 16 * inner + (_CRC_BYTES if checksum else 0)
        self._where = where or repr(array.store)
        self._chunk_limit = decode.stored_limit
        limit = self._index_bytes + inner * decode.stored_limit
        self._get = StoreGetter(array, url or self._where, secrets, limit)
        self._fill = fill_chunk(array, self.chunks)
        self._nbytes = math.prod(self.chunks) * np.dtype(array.dtype).itemsize
        self._indices: OrderedDict[tuple[int, ...], np.ndarray | None] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_array(
        cls, array: Any, where: str = "", url: str = "", secrets: Any = None
    ) -> ShardedZarrReader | None:
        """A reader for ``array`` if mixle decodes its shard layout, else ``None``."""
        from zarr.codecs import ShardingCodec

        codecs = array.metadata.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
            return None  # codecs around the shard (transpose, compression): zarr's job
        sharding = codecs[0]
        if tuple(sharding.chunk_shape) != tuple(array.chunks):
            return None
        layout = shard_layout(sharding, np.dtype(array.dtype), tuple(array.chunks))
        if layout is None:
            return None
        decode, checksum, at_end = layout
        return cls(array, decode, checksum, at_end, where, url, secrets)

    # -- shard indices ----------------------------------------------------------------
    def _parse_index(self, shard: tuple[int, ...], raw: bytes | None) -> np.ndarray | None:
        if raw is None:
            return None  # the whole shard was never written
        key = self._meta.encode_chunk_key(shard)
        if len(raw) != self._index_bytes:
            raise CorruptChunkError(
                f"shard {key!r} of zarr array {self._where} is corrupt: its index has "
                f"{len(raw)} bytes, expected {self._index_bytes} (truncated shard?)"
            )
        body = raw[: len(raw) - _CRC_BYTES] if self._checksum else raw
        if self._checksum:
            import google_crc32c

            stored = int.from_bytes(raw[-_CRC_BYTES:], "little")
            if google_crc32c.value(body) != stored:
                raise CorruptChunkError(
                    f"shard {key!r} of zarr array {self._where} is corrupt: the crc32c "
                    "checksum of its index does not match"
                )
        index = np.frombuffer(body, dtype="<u8").reshape(*self._per_shard, 2)
        self._check_index(key, index)
        return index

    def _check_index(self, key: str, index: np.ndarray) -> None:
        """Refuse an index entry past ``2**63`` or longer than a stored inner chunk can be.

        A damaged index could otherwise ask for a terabyte-long range (or one whose end
        overflows), before any byte of it is checked.
        """
        offsets, lengths = index[..., 0], index[..., 1]
        written = (offsets != _EMPTY) | (lengths != _EMPTY)
        limit = np.uint64(self._chunk_limit)
        bad = written & ((lengths > limit) | (offsets >= np.uint64(2**63 - int(limit))))
        if not bad.any():
            return
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        offset, length = (int(v) for v in index[at])
        why = (
            f"a stored inner chunk has at most {self._chunk_limit:,} bytes"
            if length > self._chunk_limit
            else "no shard reaches that far"
        )
        local = self._get.local_path(key)
        oversized = getattr(self._decode, "oversized", None)
        if oversized is not None and length > self._chunk_limit:  # strings over the vlen cap
            raise VlenLimitError(
                f"inner chunk {at} of shard {key!r} of zarr array {self._where}"
                + ("" if local is None else f" (file {local!r})")
                + f": {oversized(length)}"
            )
        raise CorruptChunkError(
            f"shard {key!r} of zarr array {self._where}"
            + ("" if local is None else f" (file {local!r})")
            + f" is corrupt: its index gives the inner chunk at {at} offset {offset:,} and "
            f"length {length:,} bytes, but {why} (damaged shard index?)"
        )

    def shard_indices(
        self, shards: Sequence[tuple[int, ...]]
    ) -> dict[tuple[int, ...], np.ndarray | None]:
        """Parsed indices of ``shards``: cached ones at once, the rest fetched in one call.

        Parameters
        ----------
        shards
            Shard grid coordinates.

        Returns
        -------
        dict
            For each shard, its index as a ``uint64`` array of shape
            ``(*inner chunks per shard, 2)`` holding ``(offset, length)`` pairs
            (``2**64 - 1`` twice: inner chunk never written), or ``None`` when the shard
            itself was never written.

        Raises
        ------
        CorruptChunkError
            When an index is truncated or its checksum does not match.
        """
        found: dict[tuple[int, ...], np.ndarray | None] = {}
        with self._lock:
            for shard in shards:
                if shard in self._indices:
                    self._indices.move_to_end(shard)
                    found[shard] = self._indices[shard]
        todo = [s for s in shards if s not in found]
        if todo:
            size = self._index_bytes
            span = (-size, None) if self._at_end else (0, size)
            raws = self._get.many(
                [(self._meta.encode_chunk_key(s), span) for s in todo], [size] * len(todo)
            )
            parsed = {s: self._parse_index(s, raw) for s, raw in zip(todo, raws)}
            found.update(parsed)
            with self._lock:
                self._indices.update(parsed)
                while len(self._indices) > SHARD_INDEX_CACHE_ENTRIES:
                    self._indices.popitem(last=False)
        return found

    def inner_chunks_written(self, shards: Sequence[tuple[int, ...]]) -> int:
        """How many inner chunks the shards ``shards`` hold, counted from their indices.

        Parameters
        ----------
        shards
            Shard grid coordinates; shards never written count 0.

        Returns
        -------
        int
            Index entries not marked as never written, over all ``shards``.
        """
        total = 0
        for index in self.shard_indices(shards).values():
            if index is not None:
                total += int(
                    np.count_nonzero((index[..., 0] != _EMPTY) | (index[..., 1] != _EMPTY))
                )
        return total

    # -- the reader protocol ----------------------------------------------------------
    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[bytes | None]:
        """Stored bytes of inner chunks ``coords`` (``None``: never written)."""
        out: list[bytes | None] = [None] * len(coords)
        for group in self.fetch_each(coords):
            for k, raw in group:
                out[k] = raw
        return out

    def fetch_each(
        self, coords: Sequence[tuple[int, ...]]
    ) -> Generator[list[tuple[int, Any]], None, None]:
        """Request inner chunks ``coords``; ``(k, stored bytes or None)`` groups as they arrive.

        The shard indices are read first (those not cached); then every coalesced range
        request starts at once, and the chunks inside each are yielded when it arrives.
        """
        requests, members, empty = self._requests(coords)
        if empty:
            yield [(k, None) for k in empty]
        if not requests:
            return
        sizes = [end - start for _, (start, end) in requests]
        with closing(self._get.stream(requests, sizes)) as arrivals:
            for group in arrivals:
                yield [i for r, blob in group for i in self._cut(requests[r], blob, members[r])]

    def _requests(
        self, coords: Sequence[tuple[int, ...]]
    ) -> tuple[list[tuple[str, tuple[int, int]]], list[list[tuple[int, int, int]]], list[int]]:
        """Coalesced range requests for ``coords``, their members, and chunks never written."""
        per = self._per_shard
        shard_of = [tuple(c // n for c, n in zip(cs, per)) for cs in coords]
        indices = self.shard_indices(list(dict.fromkeys(shard_of)))
        wanted: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
        empty: list[int] = []
        for k, (cs, shard) in enumerate(zip(coords, shard_of)):
            index = indices[shard]
            if index is None:
                empty.append(k)
                continue
            offset, length = index[tuple(c % n for c, n in zip(cs, per))]
            if offset == _EMPTY and length == _EMPTY:
                empty.append(k)
                continue
            wanted.setdefault(shard, []).append((k, int(offset), int(offset + length)))
        requests: list[tuple[str, tuple[int, int]]] = []
        members: list[list[tuple[int, int, int]]] = []
        for shard, ranges in wanted.items():
            key = self._meta.encode_chunk_key(shard)
            starts, ends = [r[1] for r in ranges], [r[2] for r in ranges]
            for group in coalesce_ranges(starts, ends):
                requests.append((key, (group.start, group.end)))
                members.append([ranges[m] for m in group.members])
        return requests, members, empty

    def _cut(
        self,
        request: tuple[str, tuple[int, int]],
        blob: bytes | None,
        members: list[tuple[int, int, int]],
    ) -> list[tuple[int, bytes]]:
        """The inner chunks' bytes inside one coalesced range; a short read raises."""
        key, (start, end) = request
        if blob is None or len(blob) != end - start:
            got = "nothing" if blob is None else f"{len(blob)} bytes"
            raise CorruptChunkError(
                f"shard {key!r} of zarr array {self._where} is corrupt: its index points "
                f"at bytes {start}-{end} but reading them returned {got} (truncated shard?)"
            )
        return [(k, blob[lo - start : hi - start]) for k, lo, hi in members]

    def decode(self, coords: tuple[int, ...], raw: bytes | None) -> np.ndarray:
        """Inner chunk ``coords`` from its stored bytes (``None``: the fill value)."""
        if raw is None:
            return self._fill
        shard = tuple(c // n for c, n in zip(coords, self._per_shard))
        key = self._meta.encode_chunk_key(shard)
        return decode_checked(self._decode, raw, self._where, key, inner=coords)

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        """One inner chunk, decoded (the per-chunk path of the reader protocol)."""
        return self.decode(coords, self.fetch_many([coords])[0])

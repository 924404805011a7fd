"""Chunk readers that hand the read planner CF-decoded chunks (``mask_and_scale=True``).

:func:`decoding_reader` wraps a backend's :class:`~mixle.reading.ChunkReader` so that each
chunk is decoded once, on the decode pool, and the decoded chunk is what the shared cache
holds and what the planner scatters: every read path (``src[...]``, ``read_boxes``,
``get_batch``, records) sees the same values. A reader that fetches in batches
(:class:`~mixle.reading.SupportsFetchMany`, remote stores) keeps ``fetch_many`` and
``fetch_each``: only its ``decode`` gains the CF step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.cf import CFDecoding
from mixle.reading import ChunkReader
from mixle.reading.executor import new_token

__all__ = ["CFChunkReader", "CFFetchingReader", "CFStreamingReader", "decoding_reader"]


class CFChunkReader:
    """Chunks of ``inner``, CF-decoded; its own cache token (never the raw chunks')."""

    def __init__(self, inner: ChunkReader, decoding: CFDecoding) -> None:
        self.inner = inner
        self.decoding = decoding
        self.chunks = inner.chunks
        self.token = new_token()

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        """Chunk ``coords``, read by ``inner`` and decoded."""
        return self.decoding.decode(self.inner.read_chunk(coords))


class CFFetchingReader(CFChunkReader):
    """:class:`CFChunkReader` of a reader with ``fetch_many``: fetches as it does."""

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[Any]:
        """The stored payloads, as ``inner`` fetches them."""
        return self.inner.fetch_many(coords)  # type: ignore[attr-defined, no-any-return]

    def decode(self, coords: tuple[int, ...], raw: Any) -> np.ndarray:
        """Chunk ``coords`` decoded by ``inner`` from its payload, then CF-decoded."""
        return self.decoding.decode(self.inner.decode(coords, raw))  # type: ignore[attr-defined]


class CFStreamingReader(CFFetchingReader):
    """:class:`CFFetchingReader` of a reader that also has ``fetch_each``."""

    def fetch_each(self, coords: Sequence[tuple[int, ...]]) -> Iterator[list[tuple[int, Any]]]:
        """``inner``'s arrivals, unchanged (closing them cancels what is in flight)."""
        return self.inner.fetch_each(coords)  # type: ignore[attr-defined, no-any-return]


def decoding_reader(inner: ChunkReader, decoding: CFDecoding) -> CFChunkReader:
    """``inner`` wrapped to CF-decode its chunks, keeping its batch-fetch methods."""
    if getattr(inner, "fetch_many", None) is None:
        return CFChunkReader(inner, decoding)
    if getattr(inner, "fetch_each", None) is None:
        return CFFetchingReader(inner, decoding)
    return CFStreamingReader(inner, decoding)

"""The Loader over streams: iterables with no length, read in order, sharded, resumable.

``mixle.Loader(stream, ...)`` returns a :class:`StreamLoader` when :func:`is_stream` says the
source is one (an iterable, a zero-argument factory or an iterator without ``__len__`` and
``__getitem__``).
"""

from mixle.loading.streams.detect import is_stream
from mixle.loading.streams.loader import StreamLoader
from mixle.loading.streams.shuffle_buffer import shuffle_buffer

__all__ = ["StreamLoader", "is_stream", "shuffle_buffer"]

"""Exceptions raised by mixle; each subclasses the builtin a caller would catch."""

from __future__ import annotations

__all__ = [
    "ArrayNotFoundError",
    "NotAnArrayError",
    "SchemaMismatchError",
    "SourceClosedError",
]


class SourceClosedError(ValueError):
    """An operation was attempted on a source after ``close()``."""


class ArrayNotFoundError(KeyError):
    """A zarr component or HDF5 dataset does not exist; the message lists what does."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class NotAnArrayError(ValueError):
    """A path or component names a group rather than an array; the message lists its arrays."""


class SchemaMismatchError(ValueError):
    """A source or sampler does not match the ``schema`` it was given."""

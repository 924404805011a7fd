"""Utilities shared across mixle: optional dependencies and parallel helpers."""

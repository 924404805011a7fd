"""Patch placement math and the samplers over a source: patch, grid, stitch, weighted, aligned."""

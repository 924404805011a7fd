"""N-D array sources: the shared ``ArraySource`` contract and one sub-package per storage family."""

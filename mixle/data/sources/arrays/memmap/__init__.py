"""Raw and ``.npy`` memory-mapped volumes, guarded against files cut short."""

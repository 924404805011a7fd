"""Sources made of sources: concatenate, mix, select and map, keeping each record's origin."""

"""Pure index math: counter-based hashing, seeded permutations, sharding of an index space."""

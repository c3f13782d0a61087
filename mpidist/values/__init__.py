"""Layer 3: distributed values (PerReplica, Mirrored) and variables."""

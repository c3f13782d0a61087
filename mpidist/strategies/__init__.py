"""Layer 4: strategies (default, OneDevice, Mirrored), their contexts, run and merge_call."""

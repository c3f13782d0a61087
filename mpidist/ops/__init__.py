"""Layer 3: cross-device ops: combining values that live on several devices of one process."""

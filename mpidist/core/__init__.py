"""Layer 0: pure-Python building blocks (device specs, nested structures, context state)."""

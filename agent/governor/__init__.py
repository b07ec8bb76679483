"""The thermal and battery governor: a pure `step(readings, now) -> Decision` (no I/O, no threads)."""

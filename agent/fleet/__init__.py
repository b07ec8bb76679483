"""The operator's side of the fleet: push bundles, read the fleet's state, roll back, fetch a
camera frame, clear unreferenced bundles from the broker."""

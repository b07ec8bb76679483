"""Runs the active version: loading it (`loader`), the cameras' pipelines, detection events."""

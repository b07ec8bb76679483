"""The technician's status page, ``/api``, ``/metrics`` and ``/healthz`` (docs/status-page.md)."""

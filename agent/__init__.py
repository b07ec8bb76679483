"""edge-agent: the daemon, the operator's fleet side and the CLI (docs/architecture.md)."""

#: the version of edge-agent (SemVer), in one place: pyproject.toml's ``version`` is ``dynamic``,
#: read from here by setuptools when it builds (docs/fleet.md#versions says why here and not
#: importlib.metadata); ``edge-agent --version``, the status document, telemetry, the page, Home
#: Assistant and ``/metrics`` all read it (tests/agent/cli/test_main.py checks the build agrees)
__version__ = "0.2.0"

"""edge-agent: the daemon, the operator's fleet side and the CLI (docs/architecture.md)."""

#: the distribution's version, as pyproject.toml's ``version`` (tests/agent/cli/test_main.py checks
#: they agree): ``edge-agent --version`` reads it here, not through importlib.metadata's 20-70 ms
__version__ = "0.1.0"

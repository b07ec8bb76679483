"""``python -m agent.cli``: the same as the ``edge-agent`` command."""

import sys

from agent.cli.main import main

sys.exit(main())

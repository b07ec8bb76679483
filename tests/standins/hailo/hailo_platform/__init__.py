"""Stand-in for HailoRT's ``hailo_platform`` in a child process (a probe or check process):
the test double `testkit.hailo_double` under the library's name, its chip ``hailo8l`` unless
$EDGE_AGENT_TEST_HAILO_ARCH names another. A test puts this folder first on ``PYTHONPATH``
(`testkit.standin_env`); in the test's own process it uses `testkit.hailo_double.installed`."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "support"))

from testkit import hailo_double

hailo_double.DEVICE_ARCH = os.environ.get("EDGE_AGENT_TEST_HAILO_ARCH", "hailo8l")
sys.modules[__name__] = hailo_double

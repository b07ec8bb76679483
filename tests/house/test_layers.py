"""The layers: the device never imports the operator's build tools."""

from __future__ import annotations

import subprocess
import sys

from testkit import REPO


def test_the_device_never_imports_the_build_tools() -> None:
    """`edge-agent run`'s imports (the CLI and the daemon) load neither agent.optimise's modules
    nor onnx, onnxslim, sympy or ONNX Runtime's quantization and transformers tooling."""
    code = (
        "import sys; import agent.daemon.agent, agent.daemon.page, agent.web.server, agent.serving.loader; "
        "from agent.cli.main import build_parser; build_parser(); "
        "print('\\n'.join(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxslim', 'sympy') "
        "or m.startswith(('agent.optimise.', 'onnxruntime.quantization', 'onnxruntime.transformers'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []

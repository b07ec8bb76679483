"""A stand-in for onnxruntime (a test double, named as such): importing it kills the importing
process with SIGSEGV, as a native library built for another CPU, or one hitting a bug under
emulation, does. Tests put its folder first on ``PYTHONPATH`` of a process under test."""

import os
import signal

os.kill(os.getpid(), signal.SIGSEGV)

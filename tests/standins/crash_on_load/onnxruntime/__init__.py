"""A stand-in for onnxruntime (a test double, named as such): it imports and lists the CPU
provider like the real one, but creating an ``InferenceSession`` kills the process with SIGILL,
as a library using instructions this CPU lacks does on its first model. Only the subset of the
API that ``runtimes.ort_backend`` touches before a session exists is here."""

import os
import signal

__version__ = "0.0+crash-on-load-standin"


def get_available_providers() -> list[str]:
    return ["CPUExecutionProvider"]


class GraphOptimizationLevel:
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class SessionOptions:
    def add_session_config_entry(self, key: str, value: str) -> None:
        pass


class InferenceSession:
    def __init__(self, *args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGILL)

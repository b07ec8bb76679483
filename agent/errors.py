"""Errors of the device side that carry a machine-readable code (published on MQTT, shown on
the status page) and a message a technician can act on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class ErrorCode(str, Enum):
    """Every machine-readable error code the agent reports: in deployment records, command
    answers and CLI errors. Documented in the "Error codes" tables of docs/bundles.md and
    docs/mqtt.md (a test keeps the tables and this list equal). A `str`, so it compares to and
    serialises as its name."""

    # a bundle refused while downloading (fleet)
    INDEX_MISMATCH = "INDEX_MISMATCH"
    DOWNLOAD_TIMEOUT = "DOWNLOAD_TIMEOUT"
    CANCELLED = "CANCELLED"
    SUPERSEDED = "SUPERSEDED"
    CHUNK_CORRUPT = "CHUNK_CORRUPT"
    BUNDLE_HASH_MISMATCH = "BUNDLE_HASH_MISMATCH"
    DOWNLOAD_FAILED = "DOWNLOAD_FAILED"
    # a bundle refused while verifying
    BUNDLE_UNREADABLE = "BUNDLE_UNREADABLE"
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    UNKNOWN_SIGNER = "UNKNOWN_SIGNER"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    NO_TRUSTED_KEYS = "NO_TRUSTED_KEYS"
    NOT_A_TAR = "NOT_A_TAR"
    BUNDLE_TRUNCATED = "BUNDLE_TRUNCATED"
    UNPACK_FAILED = "UNPACK_FAILED"
    UNSAFE_PATH = "UNSAFE_PATH"
    LINK_ENTRY = "LINK_ENTRY"
    SPECIAL_ENTRY = "SPECIAL_ENTRY"
    DUPLICATE_ENTRY = "DUPLICATE_ENTRY"
    UNEXPECTED_FILE = "UNEXPECTED_FILE"
    TOO_MANY_FILES = "TOO_MANY_FILES"
    TOO_LARGE = "TOO_LARGE"
    TOO_COMPRESSED = "TOO_COMPRESSED"
    MANIFEST_MISSING = "MANIFEST_MISSING"
    MANIFEST_NOT_JSON = "MANIFEST_NOT_JSON"
    MANIFEST_INVALID = "MANIFEST_INVALID"
    ARTIFACT_MISSING = "ARTIFACT_MISSING"
    ARTIFACT_HASH_MISMATCH = "ARTIFACT_HASH_MISMATCH"
    REFERENCE_INVALID = "REFERENCE_INVALID"
    DOWNGRADE_REFUSED = "DOWNGRADE_REFUSED"
    # a bundle that could not be installed or activated
    DISK_FULL = "DISK_FULL"
    INSTALL_FAILED = "INSTALL_FAILED"
    INTERRUPTED = "INTERRUPTED"
    ARTIFACT_NOT_A_MODEL = "ARTIFACT_NOT_A_MODEL"
    NO_RUNTIME = "NO_RUNTIME"
    DECODER_MISMATCH = "DECODER_MISMATCH"
    PARITY_FAILED = "PARITY_FAILED"
    CLASSIFIER_MISMATCH = "CLASSIFIER_MISMATCH"
    COMPILED_UNSIGNED = "COMPILED_UNSIGNED"
    TARGET_MISMATCH = "TARGET_MISMATCH"
    # a TensorRT engine that could not be built on the device (ONNX Runtime serves instead)
    ENGINE_BUILD_FAILED = "ENGINE_BUILD_FAILED"
    PROBATION_FAILED = "PROBATION_FAILED"
    # judging what a new version sees (agent/deployment/quality.py, docs/quality.md)
    SHADOW_DISAGREES = "SHADOW_DISAGREES"
    SHADOW_UNAVAILABLE = "SHADOW_UNAVAILABLE"
    PROBATION_BLIND = "PROBATION_BLIND"
    ROLLOUT_HALTED = "ROLLOUT_HALTED"
    RECORD_UNWRITABLE = "RECORD_UNWRITABLE"
    RUNTIME_CRASHED = "RUNTIME_CRASHED"
    # the agent's own update refused (agent/deployment/agent_env.py, docs/fleet.md#agent-updates)
    AGENT_UPDATE_MALFORMED = "AGENT_UPDATE_MALFORMED"
    AGENT_UPDATE_WRONG_PYTHON = "AGENT_UPDATE_WRONG_PYTHON"
    AGENT_UPDATE_WRONG_ARCHITECTURE = "AGENT_UPDATE_WRONG_ARCHITECTURE"
    AGENT_UPDATE_DOWNGRADE = "AGENT_UPDATE_DOWNGRADE"
    AGENT_UPDATE_RUNNING = "AGENT_UPDATE_RUNNING"
    AGENT_UPDATE_INSTALL_FAILED = "AGENT_UPDATE_INSTALL_FAILED"
    AGENT_UPDATE_ROLLED_BACK = "AGENT_UPDATE_ROLLED_BACK"
    # an agent bundle where a model bundle is expected, or the other way round
    WRONG_BUNDLE_KIND = "WRONG_BUNDLE_KIND"
    # building, signing and pushing bundles (operator side)
    NO_MODEL = "NO_MODEL"
    UNKNOWN_FORMAT = "UNKNOWN_FORMAT"
    KEY_INVALID = "KEY_INVALID"
    NOT_A_BUNDLE = "NOT_A_BUNDLE"
    # optimising a model at build time (agent.optimise, docs/optimising.md)
    BUILD_TOOLS_MISSING = "BUILD_TOOLS_MISSING"
    MODEL_CHECK_FAILED = "MODEL_CHECK_FAILED"
    NOT_FP32_MODEL = "NOT_FP32_MODEL"
    CALIBRATION_REQUIRED = "CALIBRATION_REQUIRED"
    VALIDATION_REQUIRED = "VALIDATION_REQUIRED"
    NO_ARTIFACT_KEPT = "NO_ARTIFACT_KEPT"
    # control documents and command answers
    UNAUTHORIZED = "UNAUTHORIZED"
    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
    BAD_PAYLOAD = "BAD_PAYLOAD"
    COMMAND_FAILED = "COMMAND_FAILED"
    BUSY = "BUSY"
    NO_PREVIOUS = "NO_PREVIOUS"
    NO_PIPELINE = "NO_PIPELINE"
    NO_FRAME = "NO_FRAME"
    NO_MEDIA = "NO_MEDIA"
    PROTOCOL_TOO_NEW = "PROTOCOL_TOO_NEW"
    # enrolment by claim (docs/fleet.md#enrolment)
    ENROL_INVALID = "ENROL_INVALID"
    ENROL_FORGED = "ENROL_FORGED"
    ENROL_EXPIRED = "ENROL_EXPIRED"
    ENROL_DENIED = "ENROL_DENIED"
    ENROL_TAKEN = "ENROL_TAKEN"
    ENROL_REPLAYED = "ENROL_REPLAYED"
    # the status page's actions
    CROSS_SITE = "CROSS_SITE"
    WRONG_HOST = "WRONG_HOST"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ErrorInfo:
    """An error as a value: the machine-readable `code` and the `message` a technician can act
    on. What a deployment record, the snapshot and the documents on MQTT carry (``{"code",
    "message"}`` in JSON)."""

    code: ErrorCode
    message: str

    @classmethod
    def of(cls, error: CodedError) -> ErrorInfo:
        return cls(error.code, error.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class CodedError(Exception):
    """An error with an upper-case `code` for machines and a `message` for people."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def error_envelope(code: ErrorCode, message: str, command: str | None = None) -> dict[str, object]:
    """The body of every refusal the device answers with: ``{"ok": false, "error": {"code",
    "message"}}``, with ``"command"`` (the command answered) between the two in an MQTT command's
    answer. The one place it is built, so the command answers and the status page's errors
    keep one shape; each caller serialises it as its wire always did."""
    body: dict[str, object] = {"ok": False}
    if command is not None:
        body["command"] = command
    body["error"] = {"code": str(code), "message": message}  # an ErrorCode reads as its name
    return body


class BundleError(CodedError):
    """A bundle was refused or could not be installed or activated.

    `code` is one of the upper-case codes listed in ``docs/bundles.md``.
    """


class ConfigError(ValueError):
    """The configuration file cannot be read or is invalid; the message lists every problem."""


def validation_problems(exc: ValidationError) -> list[str]:
    """Each problem pydantic found, as ``dotted.location: message`` (``(top)`` for the whole)."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()]

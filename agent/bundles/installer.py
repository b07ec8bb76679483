"""The deployment state machine on one device (DESIGN.md):

``VERIFYING -> INSTALLING -> ACTIVATING -> SUCCEEDED``, or ``REJECTED`` (a bad bundle: nothing
active is touched), or ``FAILED -> ROLLED_BACK`` (the new version would not run here).

- VERIFYING: unpack into ``versions/<sha>.tmp`` within the limits; check manifest, signature,
  hashes and the reference arrays.
- INSTALLING: fsync the files, rename to ``versions/<sha>``.
- ACTIVATING: pick a runtime for this board, load and warm up the model, check parity against
  ``reference.npz`` (and so for the second stage's classifier, when the bundle has one: it
  loads, gives one score per label, passes its own parity check), then switch ``current`` (the
  old one becomes ``previous``).

Each step is recorded atomically before it starts, so `Store.recover` can finish or undo it
after a crash. ``EDGE_AGENT_KILL_AT=<step>`` (a test hook) SIGKILLs the process at the named
point: ``verifying``, ``unpacked``, ``installing``, ``installed``, ``activating``, ``switched``
(and, in the daemon, ``probation``: once the new version serves, on probation). An agent
bundle's deployment has its own: ``agent-verified``, ``agent-installed``, ``agent-record``,
``agent-symlink``, ``agent-switched`` (agent/deployment/deployer.py, `AgentDirs.switch`'s steps)
and, in the new version, ``agent-confirming`` (`agent_switch.Probation`, healthy, before it
confirms).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.bundles.archive import Limits, Trust, Verified, unpack, verify_unpacked
from agent.bundles.engine_settings import version_settings
from agent.bundles.manifest import ArtifactEntry, Manifest
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store, version_key
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import Board
from pipelines.decoding.decoders import artifact_decoder
from pipelines.measure.parity import detection_agreement, parity_fraction
from runtimes.base import Runtime
from runtimes.files import move_into_place, sha256_file
from runtimes.registry import RuntimeSettings
from runtimes.selection import Preference

if TYPE_CHECKING:
    from agent.config.models import AgentConfig
    from pipelines.decoding.detector import Detector
    from runtimes.selection import Choice

log = logging.getLogger(__name__)

KILL_HOOK = "EDGE_AGENT_KILL_AT"


def checkpoint(step: str) -> None:
    """Test hook: die here, as a power cut would, when ``EDGE_AGENT_KILL_AT`` names this step."""
    if os.environ.get(KILL_HOOK) == step:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class InstallPolicy:
    """What this device accepts (signers, unsigned bundles, unpack limits) and how it runs what
    it accepts (runtime preference, each backend's settings, autotune at activation with its
    frames per configuration and latency limit)."""

    trusted: Sequence[Ed25519PublicKey] = ()
    allow_unsigned: bool = False
    limits: Limits = field(default_factory=Limits)
    preference: Preference = "auto"
    runtimes: RuntimeSettings = field(default_factory=RuntimeSettings)
    autotune: bool = False  # measure the ways to run a version at activation and serve the fastest
    autotune_frames: int = 30
    max_latency_ms: float | None = None

    @classmethod
    def from_config(cls, config: AgentConfig) -> InstallPolicy:
        """The policy agent.yaml sets; reads the trusted keys (`BundleError` ``KEY_INVALID``)."""
        limits = config.bundle_limits
        return cls(
            trusted=[load_public_key(path) for path in config.trust_keys],
            allow_unsigned=config.allow_unsigned,
            limits=Limits(limits.max_files, limits.max_bytes, limits.max_compression_ratio),
            preference=config.runtime,
            runtimes=config.runtime_settings(),
            autotune=config.deployments.autotune,
            autotune_frames=config.deployments.autotune_frames,
            max_latency_ms=config.deployments.max_latency_ms,
        )


def refuse_unsigned_code(verified: Verified) -> None:
    """`BundleError` ``COMPILED_UNSIGNED`` when an unsigned bundle (``allow_unsigned``) ships a
    compiled module (format ``tvm``: native code): only a trusted signer's bundle may."""
    compiled = [a.path for a in verified.manifest.artifacts if a.format == "tvm"]
    if compiled and verified.signer is None:
        raise BundleError(
            ErrorCode.COMPILED_UNSIGNED,
            f"{', '.join(compiled)}: compiled modules (native code) are installed only from a bundle signed by a "
            "trusted key; sign it (bundle build --key) or build it without --tvm-target",
        )


@dataclass(frozen=True)
class Activation:
    runtime: str
    artifact: str
    device: str
    reason: str
    parity: float  # fraction of output values within tolerance
    classifier: str | None = None  # the second stage's artifact that passed its checks (None: no stage)
    classifier_parity: float | None = None


def reference_outputs(runtime: Runtime, name: str, reference: Mapping[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    """Artifact `name`'s outputs for its reference input on `runtime`. Raises `BundleError`
    ``PARITY_FAILED`` when it cannot run that input."""
    from runtimes.base import InferenceError

    try:
        return list(runtime.infer([reference[f"{name}__input"]]))
    except InferenceError as exc:
        raise BundleError(ErrorCode.PARITY_FAILED, f"{name} cannot run its reference input: {exc}") from exc


def check_parity(
    runtime: Runtime,
    name: str,
    manifest: Manifest,
    reference: Mapping[str, npt.NDArray[Any]],
    outputs: Sequence[npt.NDArray[Any]] | None = None,
) -> float:
    """The fraction of artifact `name`'s outputs on `runtime` within the manifest's tolerance of
    its reference outputs; `outputs` are those for the reference input when already computed
    (`reference_outputs`; activate runs the plausibility guard on them first), else it runs it.
    Raises `BundleError` ``PARITY_FAILED`` below the manifest's minimum or when it cannot run."""
    if outputs is None:
        outputs = reference_outputs(runtime, name, reference)
    expected = [reference[f"{name}__output{i}"] for i in range(len(outputs)) if f"{name}__output{i}" in reference]
    ref = manifest.reference
    fraction = (
        parity_fraction(outputs, expected, runtime.outputs, ref.atol, ref.rtol)
        if len(expected) == len(outputs)
        else 0.0
    )
    if fraction < ref.min_fraction:
        raise BundleError(
            ErrorCode.PARITY_FAILED,
            f"{name} on {runtime.name}: {fraction:.1%} of output values within tolerance "
            f"(atol {ref.atol}, rtol {ref.rtol}); the manifest requires {ref.min_fraction:.1%}",
        )
    return fraction


def check_detection_parity(
    bundle: Verified, detector: Detector, name: str, outputs: Sequence[npt.NDArray[Any]]
) -> float:
    """For artifact `name` whose runtime gives final detections (a HEF with NMS on the chip)
    where its reference outputs are the ONNX model's raw ones: the agreement of its detections on
    the reference input with those the bundle's reference artifact's outputs decode to (same
    label, IoU >= 0.5; `agent.bundles.tuning.reference_of`, on the same reference frame).
    Raises `BundleError` ``PARITY_FAILED`` below the manifest's ``reference.min_fraction``."""
    from agent.bundles.tuning import reference_of

    manifest = bundle.manifest
    expected = reference_of(bundle.folder, manifest, bundle.reference)
    if expected.detections is None:
        raise BundleError(ErrorCode.PARITY_FAILED, f"{name}: no reference detections to compare its detections with")
    _, transform = detector.prepare(expected.frame)
    found = detector.postprocess(list(outputs), transform)
    agreement = detection_agreement(found, expected.detections)
    if agreement < manifest.reference.min_fraction:
        raise BundleError(
            ErrorCode.PARITY_FAILED,
            f"{name}: its detections agree {agreement:.1%} with {expected.reference_artifact}'s on the reference "
            f"input; the manifest requires {manifest.reference.min_fraction:.1%}",
        )
    return agreement


def runtime_choices(
    folder: Path,
    manifest: Manifest,
    board: Board,
    preference: Preference,
    entries: Sequence[ArtifactEntry] | None = None,
) -> list[Choice]:
    """The runtimes that could run this version here, best first (`runtimes.selection`): of the
    detector's artifacts, or of `entries` (the second stage's classifier's)."""
    from runtimes.registry import available_runtimes
    from runtimes.selection import Artifact, SelectionError, runtimes_for, select_runtimes

    listed = manifest.artifacts if entries is None else entries
    artifacts = [
        Artifact(
            str(folder / a.path),
            a.format,
            a.precision,
            a.target.arch if a.target else None,
            a.target.target if a.target and a.format == "rknn" else None,
            a.target.target if a.target and a.format == "hef" else None,
        )
        for a in listed
    ]
    try:
        available = available_runtimes(runtimes_for(artifacts), root=Path(board.root))
        return select_runtimes(board, available, artifacts, preference)
    except SelectionError as exc:
        raise BundleError(ErrorCode.NO_RUNTIME, str(exc)) from exc


def activate(
    bundle: Verified, board: Board, preference: Preference = "auto", settings: RuntimeSettings | None = None
) -> Activation:
    """Choose a runtime for this board, load, warm up, decode once and check parity.

    Raises `BundleError`: ``NO_RUNTIME`` (no runtime here can load any artifact),
    ``ARTIFACT_NOT_A_MODEL``, ``RUNTIME_CRASHED`` (loading it killed a check process: no other
    runtime is tried), ``DECODER_MISMATCH``, ``PARITY_FAILED``.
    """
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.detector import Detector
    from runtimes.base import ModelLoadError, NotAModelError, RuntimeUnavailable
    from runtimes.isolation import RuntimeCrashed
    from runtimes.registry import load_runtime_checked

    manifest = bundle.manifest
    settings = version_settings(settings or RuntimeSettings(), manifest)
    choices = runtime_choices(bundle.folder, manifest, board, preference)
    reference = bundle.reference
    failures = []
    for choice in choices:
        try:
            # no warm-up run here: the parity check below is the model's first inference, and the
            # runtime is closed after it (the cameras load their own, warmed up)
            path, config = Path(choice.artifact.path), settings.config_for(choice.runtime)
            runtime = load_runtime_checked(choice.runtime, path, config, warmup=False, root=Path(board.root))
        except NotAModelError as exc:  # a ModelLoadError, but the bundle's fault: no other runtime is tried
            raise BundleError(ErrorCode.ARTIFACT_NOT_A_MODEL, str(exc)) from exc
        except RuntimeCrashed as exc:
            raise BundleError(ErrorCode.RUNTIME_CRASHED, str(exc)) from exc
        except (RuntimeUnavailable, ModelLoadError) as exc:
            failures.append(f"{choice.runtime}: {exc}")
            continue
        with runtime:
            name = Path(choice.artifact.path).name
            decoder = artifact_decoder(manifest.decoder, runtime.metadata.end2end)
            try:
                detector = Detector(runtime, decoder)
                outputs = reference_outputs(runtime, name, reference)
                detector.check(reference[f"{name}__input"], outputs)  # the plausibility guard
            except DecoderError as exc:
                raise BundleError(ErrorCode.DECODER_MISMATCH, f"{name}: {exc}") from exc
            if decoder == manifest.decoder:
                fraction = check_parity(runtime, name, manifest, reference, outputs)
            else:  # final detections against a raw reference: compared as detections
                fraction = check_detection_parity(bundle, detector, name, outputs)
        stage, stage_parity = _activate_classifier(bundle, board, preference, settings)
        return Activation(choice.runtime, name, choice.device, choice.reason, fraction, stage, stage_parity)
    raise BundleError(ErrorCode.NO_RUNTIME, "no runtime could load the bundle here: " + "; ".join(failures))


def _activate_classifier(
    bundle: Verified, board: Board, preference: Preference, settings: RuntimeSettings
) -> tuple[str | None, float | None]:
    """The second stage's check at activation (when the bundle has one): its classifier loads on
    a runtime here, gives one score per label and passes its parity check. Returns the artifact
    and its parity (None, None without a stage). Raises `BundleError` ``CLASSIFIER_MISMATCH``,
    ``PARITY_FAILED``, ``NO_RUNTIME``, ``RUNTIME_CRASHED``."""
    from pipelines.decoding.classifier import Classifier
    from pipelines.decoding.decoders import DecoderError
    from runtimes.base import ModelLoadError, RuntimeUnavailable
    from runtimes.isolation import RuntimeCrashed
    from runtimes.registry import load_runtime_checked

    stage = bundle.manifest.classifier
    if stage is None:
        return None, None
    failures = []
    for choice in runtime_choices(bundle.folder, bundle.manifest, board, preference, stage.artifacts):
        path = Path(choice.artifact.path)
        try:
            runtime = load_runtime_checked(choice.runtime, path, settings.config_for(choice.runtime), warmup=False)
        except RuntimeCrashed as exc:
            raise BundleError(ErrorCode.RUNTIME_CRASHED, str(exc)) from exc
        except (RuntimeUnavailable, ModelLoadError) as exc:
            failures.append(f"{choice.runtime}: {exc}")
            continue
        with runtime:
            try:
                classifier = Classifier(runtime)
            except DecoderError as exc:
                raise BundleError(ErrorCode.CLASSIFIER_MISMATCH, f"classifier {path.name}: {exc}") from exc
            if classifier.num_classes != len(stage.labels):
                raise BundleError(
                    ErrorCode.CLASSIFIER_MISMATCH,
                    f"classifier {path.name} gives {classifier.num_classes} class scores for "
                    f"{len(stage.labels)} labels in the manifest",
                )
            return path.name, check_parity(runtime, path.name, bundle.manifest, bundle.reference)
    raise BundleError(ErrorCode.NO_RUNTIME, "no runtime could load the classifier here: " + "; ".join(failures))


def _autotune(
    verified: Verified, board: Board, policy: InstallPolicy, store: Store, deployment: Deployment
) -> Deployment:
    """Measure how this version runs best here (`agent.bundles.tuning`); keep the choice for the
    cameras, and return the record with the choice and every measured row. Never fails the
    activation: without a qualifying configuration the runtime policy decides, as without autotune."""
    from agent.bundles.tuning import autotune, tuning_record

    tuning, rows = autotune(
        verified.folder,
        verified.manifest,
        verified.reference,
        board,
        version_settings(policy.runtimes, verified.manifest),
        policy.autotune_frames,
        policy.max_latency_ms,
    )
    if tuning is not None:
        store.save_tuning(deployment.sha256, tuning)
    return dataclasses.replace(deployment, tuning=tuning_record(tuning, rows))


def _file_error(exc: OSError, what: str) -> BundleError:
    code = ErrorCode.DISK_FULL if exc.errno == errno.ENOSPC else ErrorCode.INSTALL_FAILED
    return BundleError(code, f"{what}: {exc.strerror}")


def rollback(store: Store) -> Deployment:
    """Make `previous` current again and record it; raises `LookupError` without a previous."""
    store.ensure()
    store.recover()
    sha = store.rollback()
    info = store.info(sha)
    deployment = Deployment(
        id=f"rollback-{sha[:12]}", sha256=sha, name=info.name if info else None, version=info.version if info else None
    ).to(State.ROLLED_BACK)
    store.record(deployment)
    return deployment


def install(
    bundle_path: Path,
    store: Store,
    board: Board,
    policy: InstallPolicy | None = None,
    *,
    on_state: Callable[[Deployment], None] = lambda d: None,
    deployment: Deployment | None = None,
    sha256_checked: bool = False,
    allow_downgrade: bool = False,
    probation_s: float = 0.0,
    before_switch: Callable[[Deployment, Verified], Deployment] | None = None,
) -> Deployment:
    """Run the state machine for one bundle file; returns the final deployment record.

    `deployment` continues a record that an earlier step (the daemon's download) began; the
    file must hash to its sha256 (checked while unpacking, unless `sha256_checked` says the
    download did), else it is REJECTED with ``BUNDLE_HASH_MISMATCH``. A version lower than the
    highest of the same name that succeeded here is REJECTED (``DOWNGRADE_REFUSED``) unless
    `allow_downgrade`. With `probation_s` > 0 the record ends in PROBATION once switched: the
    caller watches the version and calls `end_probation`. `before_switch` (the daemon's shadow)
    gets the record and the installed version once activation's checks passed, before anything
    switches, and returns the record (moved on as it recorded it): one it ended REJECTED ends the
    deployment there, the version removed and nothing switched; else the version switches. An
    exception from it propagates, nothing switched (the record as it last recorded it).
    """
    policy = policy or InstallPolicy()
    store.ensure()
    store.recover()
    if deployment is None:
        try:
            sha = sha256_file(bundle_path)
        except OSError as exc:
            raise BundleError(ErrorCode.BUNDLE_UNREADABLE, f"cannot read {bundle_path}: {exc.strerror}") from exc
        deployment = Deployment(
            id=f"local-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}",
            sha256=sha,
            from_sha=store.current_sha(),
            previous_before=store.previous_sha(),
        )
        sha256_checked = True  # the record's sha256 was just computed from this file
    record = dataclasses.replace(deployment, probation_s=probation_s)  # the record as it moves
    sha = record.sha256

    def step(state: State, error: BundleError | None = None) -> None:
        nonlocal record
        record = record.to(state, error)
        store.record(record)
        on_state(record)
        log.info("deployment %s: %s%s", record.id, state, f" ({error})" if error else "")

    step(State.VERIFYING)
    checkpoint("verifying")
    staging = store.versions / f"{sha}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        unpacked = unpack(
            bundle_path,
            staging,
            policy.limits,
            hash_bundle=not sha256_checked,
            trust=Trust(policy.trusted, policy.allow_unsigned),  # checked before the rest is inflated
        )
        if unpacked.sha256 is not None and unpacked.sha256 != sha:
            raise BundleError(
                ErrorCode.BUNDLE_HASH_MISMATCH,
                f"the bundle hashes to {unpacked.sha256[:12]}, not {sha[:12]} as announced; push it again",
            )
        checkpoint("unpacked")
        verified = verify_unpacked(staging, policy.trusted, policy.allow_unsigned, unpacked.files)
        refuse_unsigned_code(verified)
        if not allow_downgrade:
            refuse_downgrade(store, verified.manifest)
    except BundleError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        step(State.REJECTED, exc)
        return record
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        step(State.REJECTED, _file_error(exc, f"cannot unpack into {staging}"))
        return record
    record = dataclasses.replace(record, name=verified.manifest.name, version=verified.manifest.version)
    step(State.INSTALLING)
    checkpoint("installing")
    final = store.versions / sha
    try:
        if final.is_dir():
            shutil.rmtree(staging)  # this exact bundle is installed already (e.g. the previous version)
        else:
            move_into_place(staging, final)  # its files fsynced, then renamed
        verified = dataclasses.replace(verified, folder=final)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        step(State.REJECTED, _file_error(exc, f"cannot install into {final}"))
        return record
    checkpoint("installed")
    step(State.ACTIVATING)
    checkpoint("activating")
    try:
        activation = activate(verified, board, policy.preference, policy.runtimes)
    except BundleError as exc:
        store.remove_version(sha)
        record = record.to(State.FAILED, exc)  # FAILED -> ROLLED_BACK in one record: nothing switched
        step(State.ROLLED_BACK)
        return record
    log.info(
        "activated %s on %s (%s): parity %.1f%%",
        activation.artifact,
        activation.runtime,
        activation.reason,
        activation.parity * 100,
    )
    if activation.classifier is not None and activation.classifier_parity is not None:
        parity = activation.classifier_parity * 100
        log.info("the second stage's classifier %s: parity %.1f%%", activation.classifier, parity)
    if policy.autotune:
        record = _autotune(verified, board, policy, store, record)
    if before_switch is not None:
        record = before_switch(record, verified)
        if record.state == State.REJECTED:
            store.remove_version(sha)
            return record
    store.switch(sha)
    checkpoint("switched")
    if probation_s > 0:
        step(State.PROBATION)
        return record
    step(State.SUCCEEDED)
    store.note_installed(verified.manifest.name, verified.manifest.version)
    store.gc()
    return record


def refuse_downgrade(store: Store, manifest: Manifest) -> None:
    """`BundleError` (``DOWNGRADE_REFUSED``) when `manifest` names a version lower than the
    highest of its bundle that succeeded here (semantic-version order)."""
    highest = store.highest_version(manifest.name)
    if highest is not None and version_key(manifest.version) < version_key(highest):
        raise BundleError(
            ErrorCode.DOWNGRADE_REFUSED,
            f"{manifest.name} {manifest.version} is older than {highest}, which succeeded here; push it with "
            "--allow-downgrade (or install --allow-downgrade) to go back on purpose, or roll back",
        )


def end_probation(
    store: Store,
    deployment: Deployment,
    failure: str | None,
    on_state: Callable[[Deployment], None] = lambda d: None,
    code: ErrorCode = ErrorCode.PROBATION_FAILED,
) -> Deployment:
    """End the probation of `deployment`: SUCCEEDED when `failure` is None, else put the
    pointers back as they were before it, remove its version and record FAILED -> ROLLED_BACK
    with `code` (``PROBATION_FAILED``, or ``ROLLOUT_HALTED``) and `failure` as the reason."""
    if failure is None:
        deployment = deployment.to(State.SUCCEEDED)
        store.record(deployment)
        if deployment.name and deployment.version:
            store.note_installed(deployment.name, deployment.version)
        store.gc()
    else:
        store.undo_switch(deployment)
        deployment = deployment.to(State.FAILED, BundleError(code, failure)).to(State.ROLLED_BACK)
        store.record(deployment)
    on_state(deployment)
    log.info("deployment %s: %s%s", deployment.id, deployment.state, f" ({failure})" if failure else "")
    return deployment

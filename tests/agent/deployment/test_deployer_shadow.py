"""`agent.deployment.deployer.Deployer`'s shadow between activation and the switch, over a real
store and a real signed bundle installed by `install`, with a stand-in for the candidate's
session (what it reports is set by the test; the judge is pure): gate and report, the quiet
rule, a stop and the next start, a rollback command, a halted rollout, no camera."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.bundles import install_versions
from testkit.control import Clock, desired, gate

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_private_key
from agent.bundles.store import Store
from agent.config.models import AgentConfig
from agent.daemon.documents import deployment_payload
from agent.deployment import deployer as deployer_module
from agent.deployment.deployer import Deployer
from agent.deployment.quality import shadow_plan
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import probe
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Desired, Topics
from pipelines.measure.comparison import AgreementReport, ClassAgreement

pytestmark = pytest.mark.slow  # an install (activation, parity) per test: about 4 CPU-seconds each


def report(serving: int, candidate: int, matched: int, frames: int = 50) -> AgreementReport:
    return AgreementReport(frames, (ClassAgreement(0, serving, candidate, matched, serving, candidate),))


AGREES = {"cam": report(100, 100, 98)}
DISAGREES = {"cam": report(100, 40, 30)}
QUIET = {"cam": report(3, 3, 3)}


class FakeShadow:
    def __init__(self, reports: Mapping[str, AgreementReport], failures: int = 0) -> None:
        self._reports, self._failures, self.closed = reports, failures, False
        self.opened: tuple[Path, float] | None = None

    def open(self, version: Path, share: float) -> FakeShadow:
        self.opened = (version, share)
        return self

    def reports(self) -> Mapping[str, AgreementReport]:
        return self._reports

    def failures(self) -> Mapping[str, int]:
        return {"cam": self._failures}

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> Path:
    """The demo network signed as a newer version (1.2.0)."""
    path = tmp_path_factory.mktemp("candidate") / "demo-1.2.0.bundle"
    key = load_private_key(keys["private"])
    build_bundle([DEMO_MODELS / "demo_detector_int8_qdq.onnx"], path, name="demo", version="1.2.0", key=key)
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path], bundles: dict[str, Path]) -> Path:
    """A state directory serving demo 1.1.0 (1.0.0 before it), copied by each test."""
    state = tmp_path_factory.mktemp("installed") / "state"
    install_versions(state, keys, bundles)
    return state


class Setup:
    def __init__(self, tmp_path: Path, keys: dict[str, Path], installed: Path, shadow: dict[str, object]):
        shutil.copytree(installed, tmp_path / "state", symlinks=True)
        self.config = AgentConfig.model_validate(
            {
                "device": {"id": "cam-1"},
                "state_dir": str(tmp_path / "state"),
                "trust_keys": [str(keys["public"])],
                "operator_keys": [str(keys["operator_pub"])],
                "mqtt": {"broker": "mqtt://127.0.0.1:9"},  # never started: the records are seen by on_report
                "deployments": {"shadow": shadow},
            }
        )
        self.store = Store(self.config.state_dir)
        self.serving = self.store.current_sha()
        self.published: list[Deployment] = []
        ticks = itertools.count()
        self.policy = InstallPolicy.from_config(self.config)
        self.deployer = Deployer(
            config=self.config,
            device="cam-1",
            store=self.store,
            board=probe(),
            link=MqttLink(self.config.mqtt, "edge-agent-cam-1"),  # type: ignore[arg-type]
            topics=Topics(),
            policy=self.policy,
            gate=gate(tmp_path, keys, Clock()),
            on_switched=lambda d: None,
            payload=deployment_payload,
            clock=lambda: 5.0 * next(ticks),  # 5 s a reading: a 20 s shadow ends in a few checks
            on_report=self.published.append,
        )
        self.deployer.shadow_check_s = 0.001

    def run(self, bundle: Path, session: FakeShadow | None, document: Desired) -> Deployment:
        if session is not None:
            self.deployer._open_shadow = session.open
        plan = shadow_plan(document.shadow, self.config.deployments.shadow)
        assert plan is not None
        return install(
            bundle,
            self.store,
            probe(),
            self.policy,
            on_state=self.published.append,
            before_switch=lambda record, verified: self.deployer._shadow(document, record, verified, plan),
        )


GATE = desired(shadow={"duration_s": 20, "min_agreement": 0.8})


@pytest.fixture
def setup(tmp_path: Path, keys: dict[str, Path], installed: Path) -> Setup:
    return Setup(tmp_path, keys, installed, {})


def test_a_candidate_that_disagrees_under_a_gate_is_rejected_and_removed(setup: Setup, candidate: Path) -> None:
    session = FakeShadow(DISAGREES)
    record = setup.run(candidate, session, GATE)
    assert (record.state, record.error and record.error.code) == (State.REJECTED, ErrorCode.SHADOW_DISAGREES)
    assert record.error is not None and "agreement 0.43 < 0.8" in record.error.message
    assert "precision 0.75, recall 0.30" in record.error.message
    assert record.shadow is not None and record.shadow.outcome == "disagrees"
    assert [s for s, _ in record.history][-3:] == [State.ACTIVATING, State.SHADOW, State.REJECTED]
    assert setup.store.current_sha() == setup.serving, "the serving version untouched"
    assert not (setup.store.versions / record.sha256).exists(), "the candidate removed"
    assert session.closed and session.opened == (setup.store.versions / record.sha256, 0.1)
    assert Store(setup.config.state_dir).last_deployment() == record


def test_a_candidate_that_agrees_switches_and_keeps_the_result(setup: Setup, candidate: Path) -> None:
    record = setup.run(candidate, FakeShadow(AGREES), GATE)
    assert record.state == State.SUCCEEDED and setup.store.current_sha() == record.sha256
    assert (
        record.shadow is not None and record.shadow.outcome == "agrees" and record.shadow.cameras[0].agreement == 0.98
    )
    assert State.SHADOW in [s for s, _ in record.history]


def test_report_mode_records_a_disagreement_and_switches(setup: Setup, candidate: Path) -> None:
    document = desired(shadow={"duration_s": 20, "min_agreement": 0.8, "mode": "report"})
    record = setup.run(candidate, FakeShadow(DISAGREES), document)
    assert record.state == State.SUCCEEDED and setup.store.current_sha() == record.sha256
    assert record.shadow is not None and (record.shadow.outcome, record.shadow.mode) == ("disagrees", "report")


@pytest.mark.parametrize(("quiet", "state"), [("pass", State.SUCCEEDED), ("fail", State.REJECTED)])
def test_a_quiet_shadow_is_extended_then_ends_as_the_document_says(
    setup: Setup, candidate: Path, quiet: str, state: State
) -> None:
    document = desired(shadow={"duration_s": 20, "max_s": 60, "quiet": quiet})
    record = setup.run(candidate, FakeShadow(QUIET), document)
    assert record.state == state and record.shadow is not None and record.shadow.outcome == "quiet"
    assert record.shadow.seconds >= 60, "extended up to max_s, not judged at 20 s"
    if state == State.REJECTED:
        assert record.error is not None and record.error.code == ErrorCode.SHADOW_DISAGREES
        assert "too few detections to compare" in record.error.message
        assert setup.store.current_sha() == setup.serving


def test_candidate_failures_are_in_the_result(setup: Setup, candidate: Path) -> None:
    record = setup.run(candidate, FakeShadow(AGREES, failures=3), GATE)
    assert record.shadow is not None and "the candidate failed on frames (cam: 3)" in record.shadow.message


def test_the_shadows_progress_is_published_while_it_runs(setup: Setup, candidate: Path) -> None:
    setup.run(candidate, FakeShadow(QUIET), desired(shadow={"duration_s": 100}))
    running = [d.shadow for d in setup.published if d.shadow is not None and d.shadow.outcome == "running"]
    assert running and running[0].cameras[0].frames == 50 and running[0].message.startswith("comparing for")


def test_no_camera_is_shadow_unavailable(setup: Setup, candidate: Path) -> None:
    def no_camera(version: Path, share: float) -> FakeShadow:
        raise BundleError(ErrorCode.SHADOW_UNAVAILABLE, "no camera is serving here")

    setup.deployer._open_shadow = no_camera
    record = setup.run(candidate, None, GATE)
    assert (record.state, record.error and record.error.code) == (State.REJECTED, ErrorCode.SHADOW_UNAVAILABLE)
    assert setup.store.current_sha() == setup.serving and not (setup.store.versions / record.sha256).exists()
    setup.deployer._open_shadow = None  # an agent without cameras at all
    assert setup.run(candidate, None, GATE).error.code == ErrorCode.SHADOW_UNAVAILABLE  # type: ignore[union-attr]


def test_a_rollback_command_cancels_the_shadow_and_is_answered_by_it(setup: Setup, candidate: Path) -> None:
    asked: Future[Deployment] = Future()
    setup.deployer._rollbacks.append(asked)
    session = FakeShadow(QUIET)
    record = setup.run(candidate, session, GATE)
    assert (record.state, record.error and record.error.code) == (State.REJECTED, ErrorCode.CANCELLED)
    assert asked.result(0) == record and setup.deployer._rollbacks == []
    assert setup.store.current_sha() == setup.serving and session.closed


def test_a_halted_rollout_ends_the_shadow(setup: Setup, candidate: Path) -> None:
    setup.deployer._halted.set()
    record = setup.run(candidate, FakeShadow(QUIET), GATE)
    assert (record.state, record.error and record.error.code) == (State.REJECTED, ErrorCode.ROLLOUT_HALTED)
    assert setup.store.current_sha() == setup.serving


def test_a_stop_during_the_shadow_ends_it_interrupted_at_the_next_start_never_retried(
    setup: Setup, candidate: Path
) -> None:
    setup.deployer._stop.set()
    session = FakeShadow(QUIET)
    with pytest.raises(deployer_module._ShadowStopped):
        setup.run(candidate, session, GATE)
    assert session.closed
    left = setup.store.last_deployment()
    assert left is not None and left.state == State.SHADOW and setup.store.current_sha() == setup.serving
    recovered = Store(setup.config.state_dir).recover()  # the next start
    assert recovered is not None and (recovered.state, recovered.error and recovered.error.code) == (
        State.REJECTED,
        ErrorCode.INTERRUPTED,
    )
    assert not (setup.store.versions / left.sha256).exists() and setup.store.current_sha() == setup.serving
    assert not Deployer._retry_after_crash(recovered), "the candidate may have taken the process down"


def test_agent_yaml_can_require_a_shadow_on_every_deployment(
    tmp_path: Path, keys: dict[str, Path], installed: Path, candidate: Path
) -> None:
    setup = Setup(tmp_path, keys, installed, {"duration_s": 30, "min_agreement": 0.9, "quiet": "fail"})
    plan = shadow_plan(None, setup.config.deployments.shadow)
    assert plan is not None and (plan.duration_s, plan.max_s, plan.min_agreement) == (30, 120, 0.9)
    record = setup.run(candidate, FakeShadow(AGREES), desired())
    assert record.state == State.SUCCEEDED and record.shadow is not None and record.shadow.seconds >= 30

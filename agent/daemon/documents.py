"""The ``status``, ``telemetry`` and ``deployment`` documents (docs/mqtt.md), made from an
`AgentSnapshot` or a deployment record, and made into JSON.

This is the device's JSON edge of those topics: the snapshot's and the record's typed values
become the documents' models (agent/mqtt/device_documents.py, which the operator's side reads
back) here and nowhere else, and the `*_payload` functions are the only place they become bytes
(latencies in ms, fps in frames per second, times in Unix seconds).
"""

from __future__ import annotations

from agent.bundles.record import Deployment
from agent.hardware.readings import SensorReadings
from agent.mqtt.device_documents import (
    AnalyticsTelemetry,
    BoardRef,
    BundleRef,
    CameraTelemetry,
    DeploymentDocument,
    DownloadProgress,
    EngineBrief,
    EventTelemetry,
    GovernorBrief,
    GovernorTelemetry,
    HistoryEntry,
    MqttTelemetry,
    OutboxTelemetry,
    RolloutBrief,
    RuntimeBrief,
    SensorsTelemetry,
    StatusDocument,
    SystemTelemetry,
    TelemetryDocument,
    bounded_quality,
    bounded_shadow,
)
from agent.mqtt.protocol import PROTOCOL, json_payload
from agent.snapshot import AgentSnapshot


def status_document(snapshot: AgentSnapshot) -> StatusDocument:
    """The retained ``status`` document: who the device is and what it serves."""
    board, governor = snapshot.board, snapshot.governor
    return StatusDocument(
        state=snapshot.state,
        ts=round(snapshot.ts, 3),
        device=snapshot.device,
        group=snapshot.group,
        agent_version=snapshot.agent_version,
        protocol=PROTOCOL,
        board=BoardRef(kind=board.kind, model=board.model, arch=board.arch),
        bundle=BundleRef.model_validate(snapshot.bundle) if snapshot.bundle else None,
        runtime=snapshot.cameras[0].runtime if snapshot.cameras else None,
        cameras=(names := tuple(camera.name for camera in snapshot.cameras)),
        pipelines=names,  # the old name, kept for one release
        fps=snapshot.fps,
        temperature_c=snapshot.sensors.temp_c if snapshot.sensors else None,
        governor=GovernorBrief(level=governor.decision.level, reason=governor.decision.reason) if governor else None,
        error=snapshot.serving_error,
        deployment_problem=snapshot.deployment_problem,
        warnings=snapshot.warnings,
        rollout=RolloutBrief.model_validate(snapshot.rollout) if snapshot.rollout else None,
        runtimes={info.name: RuntimeBrief.model_validate(info) for info in snapshot.runtimes},
        engine=EngineBrief.model_validate(snapshot.engine) if snapshot.engine else None,
    )


def telemetry_document(snapshot: AgentSnapshot) -> TelemetryDocument:
    """One ``telemetry`` message: per-camera numbers, system readings, sensors (all null until
    the first reading), energy per frame and per hour, the governor, the link."""
    broker = snapshot.broker
    return TelemetryDocument(
        ts=round(snapshot.ts, 3),
        device=snapshot.device,
        agent_version=snapshot.agent_version,
        fps=snapshot.fps,
        dropped=sum(camera.dropped for camera in snapshot.cameras),
        cameras=(cameras := _with_drift(snapshot, tuple(CameraTelemetry.model_validate(c) for c in snapshot.cameras))),
        pipelines=cameras,  # the old name, kept for one release
        system=SystemTelemetry.model_validate(snapshot.system) if snapshot.system else None,
        sensors=SensorsTelemetry.model_validate((snapshot.sensors or SensorReadings()).to_json()),
        energy_mj_per_frame=snapshot.energy_mj_per_frame,
        energy_wh=(energy := snapshot.energy_json() or {}).get("energy_wh"),
        energy_wh_per_h=energy.get("energy_wh_per_h"),
        governor=GovernorTelemetry.model_validate(snapshot.governor.to_json()) if snapshot.governor else None,
        mqtt=MqttTelemetry.model_validate(broker) if broker else None,
        outbox=OutboxTelemetry.model_validate(snapshot.outbox) if snapshot.outbox else None,
        events=EventTelemetry.model_validate(snapshot.events),
        analytics=AnalyticsTelemetry.model_validate(snapshot.analytics_json()),
    )


def _with_drift(snapshot: AgentSnapshot, cameras: tuple[CameraTelemetry, ...]) -> tuple[CameraTelemetry, ...]:
    """Each camera's telemetry with its drift score, where it has one (issue 40)."""
    scores = {d.camera: d.score.score for d in snapshot.drift if d.score is not None}
    return tuple(c.model_copy(update={"drift": scores[c.name]}) if c.name in scores else c for c in cameras)


def deployment_document(deployment: Deployment, progress: DownloadProgress | None = None) -> DeploymentDocument:
    """The retained ``deployment`` document (docs/mqtt.md): the record and the download's progress."""
    return DeploymentDocument(
        id=deployment.id,
        sha256=deployment.sha256,
        state=deployment.state,
        name=deployment.name,
        version=deployment.version,
        error=deployment.error,
        from_sha=deployment.from_sha,
        previous_before=deployment.previous_before,
        attempt=deployment.attempt,
        probation_s=deployment.probation_s,
        history=tuple(HistoryEntry(state=state, ts=ts) for state, ts in deployment.history),
        tuning=deployment.tuning,
        progress=progress,
        shadow=bounded_shadow(deployment.shadow),
        quality=bounded_quality(deployment.quality),
        kind="agent" if deployment.kind == "agent" else None,
    )


def status_payload(snapshot: AgentSnapshot) -> bytes:
    return status_document(snapshot).to_bytes()


def telemetry_payload(snapshot: AgentSnapshot) -> bytes:
    return telemetry_document(snapshot).to_bytes()


def deployment_payload(deployment: Deployment, progress: DownloadProgress | None = None) -> bytes:
    return deployment_document(deployment, progress).to_bytes()


def deployment_report_payload(device: str, deployment: Deployment) -> bytes:
    """One ``deployments`` report: the device and the record as the ``deployment`` document
    has it (without the download's progress)."""
    document = deployment_document(deployment).model_dump(mode="json", by_alias=True)
    return json_payload({"device": device, **document})


def last_will(device: str, agent_version: str) -> bytes:
    """The status the broker publishes when the agent is killed or cut off: ``{"state":
    "offline", "device", "agent_version", "protocol"}``, nothing else (`fleet status` shows the
    last bundle from the record, and filters an offline device by its version too)."""
    will = StatusDocument(state="offline", device=device, agent_version=agent_version, protocol=PROTOCOL)
    return will.model_dump_json(exclude_unset=True).encode()

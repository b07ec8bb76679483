"""The ``status``, ``telemetry`` and ``deployment`` documents (docs/mqtt.md), made from an
`AgentSnapshot` or a deployment record.

This is the JSON edge of the MQTT topics: the snapshot's typed values become the documents'
dicts here and nowhere else (latencies in ms, fps in frames per second, times in Unix seconds).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from agent.bundles.record import Deployment
from agent.hardware.readings import SensorReadings
from agent.snapshot import AgentSnapshot, DeploymentStatus, DownloadProgress

_CAMERA_FIELDS = (
    *("name", "fps", "max_fps", "frames", "dropped", "errors", "paused", "latency_ms", "source_status"),
    *("shared_by", "mean_batch"),
)
_RUNTIME_FIELDS = ("available", "version", "crashed", "reason")


def status_document(snapshot: AgentSnapshot) -> dict[str, Any]:
    """The retained ``status`` document: who the device is and what it serves."""
    board = snapshot.board
    return {
        "state": snapshot.state,
        "ts": round(snapshot.ts, 3),
        "device": snapshot.device,
        "group": snapshot.group,
        "agent_version": snapshot.agent_version,
        "board": {"kind": board.kind, "model": board.model, "arch": board.arch},
        "bundle": asdict(snapshot.bundle) if snapshot.bundle else None,
        "runtime": snapshot.cameras[0].runtime if snapshot.cameras else None,
        "pipelines": [camera.name for camera in snapshot.cameras],
        "fps": snapshot.fps,
        "temperature_c": snapshot.sensors.temp_c if snapshot.sensors else None,
        "governor": {"level": snapshot.governor.decision.level, "reason": snapshot.governor.decision.reason}
        if snapshot.governor
        else None,
        "error": snapshot.serving_error,
        "deployment_problem": snapshot.deployment_problem,
        "warnings": list(snapshot.warnings),
        "rollout": asdict(snapshot.rollout) if snapshot.rollout else None,
        "runtimes": runtimes_document(snapshot),
        "engine": asdict(snapshot.engine) if snapshot.engine else None,
    }


def runtimes_document(snapshot: AgentSnapshot) -> dict[str, dict[str, Any]]:
    """``{name: {"available", "version", "crashed", "reason"}}`` for each backend probed at
    start: a technician sees which native library is missing or crashed, and its version."""
    return {info.name: {key: getattr(info, key) for key in _RUNTIME_FIELDS} for info in snapshot.runtimes}


def telemetry_document(snapshot: AgentSnapshot) -> dict[str, Any]:
    """One ``telemetry`` message: per-camera numbers, system readings, sensors (all null until
    the first reading), energy per frame, the governor, the link."""
    cameras = [asdict(camera) for camera in snapshot.cameras]
    broker = snapshot.broker
    return {
        "ts": round(snapshot.ts, 3),
        "device": snapshot.device,
        "fps": snapshot.fps,
        "dropped": sum(camera.dropped for camera in snapshot.cameras),
        "pipelines": [{key: camera[key] for key in _CAMERA_FIELDS} for camera in cameras],
        "system": asdict(snapshot.system) if snapshot.system else {},
        "sensors": (snapshot.sensors or SensorReadings()).to_json(),
        "energy_mj_per_frame": snapshot.energy_mj_per_frame,
        "governor": snapshot.governor.to_json() if snapshot.governor else None,
        "mqtt": {"queued": broker.queued, "dropped": broker.dropped, "reconnects": broker.reconnects}
        if broker
        else None,
        "events": asdict(snapshot.events),
        "analytics": snapshot.analytics_json(),
    }


def deployment_document(deployment: Deployment, progress: DownloadProgress | None = None) -> dict[str, Any]:
    """The retained ``deployment`` document (docs/mqtt.md)."""
    document = asdict(deployment)
    document["history"] = [{"state": s, "ts": t} for s, t in deployment.history]
    if progress is not None:
        document["progress"] = asdict(progress)
    return document


def deployment_status(deployment: Deployment, progress: DownloadProgress | None = None) -> DeploymentStatus:
    """The record as the agent snapshot shows it."""
    error = deployment.error or {}
    return DeploymentStatus(
        id=deployment.id,
        name=deployment.name,
        version=deployment.version,
        sha256=deployment.sha256,
        state=deployment.state,
        error_code=error.get("code"),
        error_message=error.get("message"),
        attempt=deployment.attempt,
        progress=progress,
    )

"""Typed values of a running agent built by hand for the tests (`PipelineStats`, `LinkStats`,
`AgentSnapshot`): each builder takes the fields to change."""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.hardware.board import Board
from agent.hardware.system import SystemReadings
from agent.mqtt.link import LinkStats
from agent.snapshot import AgentSnapshot, EventCounts, VersionRef
from pipelines.latency import Percentiles
from pipelines.pipeline import PipelineStats
from pipelines.sources.frames import SourceState


def camera(name: str = "cam0", **changes: Any) -> PipelineStats:
    stats = PipelineStats(
        name=name,
        source="synthetic",
        fps=10.0,
        frames=100,
        dropped=0,
        errors=0,
        swaps=0,
        paused=False,
        max_fps=None,
        workers=1,
        latency_ms={"total": Percentiles(40.0, 60.0)},
        source_status=SourceState("running", None, 0),
        runtime="onnxruntime",
        model="m.onnx",
    )
    return dataclasses.replace(stats, **changes)


def link(**changes: Any) -> LinkStats:
    return dataclasses.replace(LinkStats("mqtt://b:1883", True, 0, 0, 0, None), **changes)


def snapshot(**changes: Any) -> AgentSnapshot:
    base = AgentSnapshot(
        ts=1000.0,
        state="online",
        device="cam-1",
        group=None,
        agent_version="0",
        board=Board("generic", "generic x86_64", "x86_64", 2, False),
        bundle=VersionRef("demo", "1.0.0", "a" * 64),
        previous=None,
        serving=None,
        serving_error=None,
        deployment=None,
        deployment_problem=None,
        cameras=(camera(),),
        broker=None,
        system=SystemReadings(1.0, 1.0, 1.0, 1.0, 1.0, 50_000.0, 100_000.0, True),
        events=EventCounts(0, 0),
    )
    return dataclasses.replace(base, **changes)


def full_snapshot(**changes: Any) -> AgentSnapshot:
    """A snapshot with every optional part present: sensors of each kind, the governor with
    thresholds, a staged rollout, an engine build that failed, runtimes (one crashed), the
    broker, analytics, warnings (the documents' every field has a value to carry)."""
    from agent.governor.levels import Actions, BatteryLevel, Decision, TemperatureThresholds, ThermalLevel
    from agent.hardware.readings import Battery, Fan, Gpu, Rail, SensorReadings, ThermalZone, Throttled, TripPoint
    from agent.snapshot import EngineStatus, GovernorState, RolloutPosition
    from pipelines.tracking.analytics import CameraCounts
    from pipelines.tracking.zones import LineCount, ZoneCount
    from runtimes.base import RuntimeInfo

    sensors = SensorReadings(
        thermal_zones=(ThermalZone("cpu-thermal", 61.5, (TripPoint(95.0, "passive", 2.0),)), ThermalZone("gpu", None)),
        rails=(Rail("VDD_IN", 5.05, 1.2, 6.06),),
        power_w=6.06,
        power_source="VDD_IN",
        battery=Battery(81.0, "Discharging", 7.4, -0.8, 5.9, "power_supply"),
        throttled=Throttled.from_bits(0x50005),
        fan=Fan(40.0, 2100.0, "pwm-fan"),
        gpu=Gpu("Orin", 37.0, 55.0, 512.0, 7600.0, 3.1, 918.0),
        sources=("thermal", "ina3221", "vcgencmd"),
    )
    thresholds = TemperatureThresholds(70.0, 80.0, 90.0, 3.0, ("config", "trip points", "default"))
    decision = Decision(
        "WARM", ThermalLevel.WARM, BatteryLevel.OK, "61.5 °C >= 60 °C", 990.0, 990.0, 900.0,
        Actions(fps_cap=10.0, fan_percent=40.0), thresholds, False, 61.5, 81.0,
    )  # fmt: skip
    base = snapshot(
        group="lobby",
        cameras=(
            camera("cam0", max_fps=10.0, shared_by=2, mean_batch=1.5, in_view={"person": 2, "car": 1}),
            camera("cam1", dropped=3),
        ),
        broker=link(queued=2, dropped=1, reconnects=4),
        serving_error="parity 0.91 below 0.99",
        deployment_problem="UNAUTHORIZED: signed by an unknown key",
        warnings=("allow_unsigned_control is on",),
        sensors=sensors,
        governor=GovernorState(decision, 990.0, 40.0, None),
        rollout=RolloutPosition("demo-1.1.0-abc", 2, 4, 1600.0, "waiting"),
        runtimes=(
            RuntimeInfo("onnxruntime", True, "1.20.1", ("CPUExecutionProvider",)),
            RuntimeInfo("litert", False, None, (), "ai_edge_litert crashed", "SIGSEGV"),
        ),
        engine=EngineStatus(
            "demo 1.1.0",
            "m.onnx",
            "fp16",
            "failed",
            None,
            0.4,
            950.0,
            980.0,
            "ENGINE_BUILD_FAILED",
            "node Conv_3",
            "ONNX",
        ),
        analytics=(CameraCounts("cam0", (LineCount("door", 5, 2),), (ZoneCount("till", 1, 9),), 3),),
    )
    return dataclasses.replace(base, **changes)

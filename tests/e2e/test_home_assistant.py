"""End to end: a real Home Assistant core (build/ha-env, scripts/setup.sh dev) discovers an agent
through its MQTT integration on the test's mosquitto. HA's own state (REST ``/api/states``)
shows every entity with the value the agent published and its unit, device class and state
class; the agent's kill -9 (its last will) makes them ``unavailable``; a zone removed from
agent.yaml and a SIGHUP removes its entities from HA."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.bundles import install_versions
from testkit.home_assistant import HASS, HomeAssistant
from testkit.needs import missing
from testkit.net import wait_until

DEVICE = "ha-dev"
E = "ha_dev"  # the device's slug in entity ids
LINE = {"name": "gate", "points": [[0, 120], [320, 120]]}
ZONES = [
    {"name": "porch", "polygon": [[0, 0], [160, 0], [160, 240], [0, 240]]},
    {"name": "yard", "polygon": [[160, 0], [320, 0], [320, 240], [160, 240]]},
]


CLASSES = ["circle", "square"]  # each gets an "in view" sensor of its own; triangles are dropped


def _pipeline(zones: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": "cam0", "source": "synthetic", "max_fps": 10, "lines": [LINE], "zones": zones, "classes": CLASSES}]


def _text(value: Any) -> str:
    """A published JSON value as Home Assistant's state shows it."""
    return "unknown" if value is None else str(value)


def test_home_assistant_discovers_the_agent(
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    agents: Callable[..., AgentProcess],
    keys: dict[str, Path],
    bundles: dict[str, Path],
) -> None:
    if not HASS.exists():
        missing("home_assistant", f"no Home Assistant core at {HASS} (bash scripts/setup.sh dev makes it)")
    ha = HomeAssistant(tmp_path / "ha", broker.port).start()
    try:
        install_versions(tmp_path / DEVICE / "state", keys, bundles)
        integrations = {"home_assistant": {"enabled": True, "image_interval_s": 1}}
        agent = agents(DEVICE, cameras=_pipeline(ZONES), integrations=integrations)
        telemetry = watcher.wait_json(f"edge/{DEVICE}/telemetry", lambda t: bool(t.get("cameras")), 90)
        expected_units = {
            f"sensor.{E}_fps": ("fps", None, "measurement"),
            f"sensor.{E}_temperature": ("°C", "temperature", "measurement"),
            f"sensor.{E}_power": ("W", "power", "measurement"),
            f"sensor.{E}_battery": ("%", "battery", "measurement"),
            f"sensor.{E}_cam0_fps": ("fps", None, "measurement"),
            f"sensor.{E}_line_gate_in": ("crossings", None, "total_increasing"),
            f"sensor.{E}_line_gate_out": ("crossings", None, "total_increasing"),
            f"sensor.{E}_zone_porch_now": ("objects", None, "measurement"),
            f"sensor.{E}_zone_porch_total": ("entries", None, "total_increasing"),
            f"sensor.{E}_zone_yard_now": ("objects", None, "measurement"),
            f"sensor.{E}_zone_yard_total": ("entries", None, "total_increasing"),
            f"sensor.{E}_cam0_objects": ("objects", None, "measurement"),
            f"sensor.{E}_cam0_circle_in_view": ("objects", None, "measurement"),
            f"sensor.{E}_cam0_square_in_view": ("objects", None, "measurement"),
        }
        others = [f"sensor.{E}_governor", f"sensor.{E}_version", f"binary_sensor.{E}_problem"]
        others += [f"sensor.{E}_cam0_status", f"sensor.{E}_last_event", f"image.{E}_cam0_image"]
        wanted = [*expected_units, *others]
        states = wait_until(lambda: (s := ha.states()).keys() >= set(wanted) and s, 120, f"HA entities {wanted}")
        for entity, (unit, device_class, state_class) in expected_units.items():
            attributes = states[entity]["attributes"]
            assert attributes.get("unit_of_measurement") == unit, (entity, attributes)
            assert attributes.get("device_class") == device_class, (entity, attributes)
            assert attributes.get("state_class") == state_class, (entity, attributes)
        governor = states[f"sensor.{E}_governor"]["attributes"]
        assert governor["device_class"] == "enum", governor  # its options are in the registry, not the state
        assert states[f"binary_sensor.{E}_problem"]["attributes"]["device_class"] == "problem"

        # each value as HA shows it is one the agent published: HA and the watcher converge on the newest
        def from_status(field: Callable[[dict[str, Any]], Any]) -> Callable[[], str]:
            return lambda: _text(field(watcher.json(f"edge/{DEVICE}/status")))

        def from_telemetry(field: Callable[[dict[str, Any]], Any]) -> Callable[[], str]:
            return lambda: _text(field(watcher.json(f"edge/{DEVICE}/telemetry")))

        def cam(t: dict[str, Any]) -> dict[str, Any]:
            return next(p for p in t["cameras"] if p["name"] == "cam0")

        values: dict[str, Callable[[], str]] = {
            f"sensor.{E}_fps": from_status(lambda s: s["fps"]),
            f"sensor.{E}_temperature": from_status(lambda s: s["temperature_c"]),
            f"sensor.{E}_governor": from_status(lambda s: (s["governor"] or {}).get("level")),
            f"sensor.{E}_version": from_status(lambda s: f"{s['bundle']['name']} {s['bundle']['version']}"),
            f"binary_sensor.{E}_problem": from_status(
                lambda s: "on" if s["error"] or s["deployment_problem"] or s["warnings"] else "off"
            ),
            f"sensor.{E}_cam0_fps": from_telemetry(lambda t: cam(t)["fps"]),
            f"sensor.{E}_cam0_status": from_telemetry(lambda t: cam(t)["source_status"]["state"]),
            f"sensor.{E}_power": from_telemetry(lambda t: t["sensors"]["power_w"]),
            f"sensor.{E}_battery": from_telemetry(lambda t: (t["sensors"]["battery"] or {}).get("percent")),
            f"sensor.{E}_line_gate_in": from_telemetry(lambda t: t["analytics"]["lines"]["gate"]["in"]),
            f"sensor.{E}_line_gate_out": from_telemetry(lambda t: t["analytics"]["lines"]["gate"]["out"]),
            f"sensor.{E}_zone_porch_now": from_telemetry(lambda t: t["analytics"]["zones"]["porch"]["now"]),
            f"sensor.{E}_zone_porch_total": from_telemetry(lambda t: t["analytics"]["zones"]["porch"]["total"]),
            f"sensor.{E}_cam0_objects": from_telemetry(lambda t: sum(cam(t)["in_view"].values())),
            f"sensor.{E}_cam0_circle_in_view": from_telemetry(lambda t: cam(t)["in_view"].get("circle", 0)),
            f"sensor.{E}_cam0_square_in_view": from_telemetry(lambda t: cam(t)["in_view"].get("square", 0)),
        }
        for entity, published in values.items():

            def same(entity: str = entity, published: Callable[[], str] = published) -> bool:
                shown, sent = ha.get(f"/api/states/{entity}")["state"], published()
                number = shown.replace(".", "", 1).isdigit() and sent.replace(".", "", 1).isdigit()
                return (float(shown) == float(sent)) if number else shown == sent

            wait_until(same, 60, f"{entity} showing what the agent published ({published()})")

        # the per-label counts as the objects sensor's attributes; some frames do show objects
        def by_label() -> bool:
            shown = ha.get(f"/api/states/sensor.{E}_cam0_objects")["attributes"]
            sent = cam(watcher.json(f"edge/{DEVICE}/telemetry"))["in_view"]
            assert "triangle" not in sent, sent  # the classes filter drops them before they are counted
            return bool(sent) and {k: v for k, v in shown.items() if k in ("circle", "square", "triangle")} == sent

        wait_until(by_label, 60, "objects in view by label as attributes")
        # the device page's identity: one device, the agent's version as its firmware
        jpeg = wait_until(
            lambda: ha.get_bytes(states[f"image.{E}_cam0_image"]["attributes"]["entity_picture"]), 60, "a frame"
        )
        assert jpeg[:2] == b"\xff\xd8", jpeg[:8]

        # SIGHUP without the yard: its entities leave HA
        path = tmp_path / DEVICE / "agent.yaml"
        config = yaml.safe_load(path.read_text())
        config["cameras"] = _pipeline(ZONES[:1])
        path.write_text(yaml.safe_dump(config))
        assert agent.process is not None
        os.kill(agent.process.pid, signal.SIGHUP)
        gone = {f"sensor.{E}_zone_yard_now", f"sensor.{E}_zone_yard_total"}
        wait_until(lambda: not gone & ha.states().keys(), 90, f"{gone} removed from HA")
        assert f"sensor.{E}_zone_porch_now" in ha.states()

        # kill -9: the last will makes every entity unavailable
        agent.kill()
        remaining = [e for e in wanted if e not in gone]
        wait_until(lambda: all(ha.states()[e]["state"] == "unavailable" for e in remaining), 60, "entities unavailable")
        del telemetry
    finally:
        ha.stop()

#!/usr/bin/env python3
"""Screenshot Home Assistant's device page of an edge device: docs/home-assistant.png.

A mosquitto on 127.0.0.1, a real Home Assistant core from ``build/ha-env`` (``scripts/setup.sh
dev``) with its frontend, and a daemon in this process on the Jetson Orin Nano's fake sensor
tree (temperature, power), a signed demo bundle and one synthetic camera with a line, a zone
and a ``classes`` filter, Home Assistant discovery on. Once HA shows the device's entities, Debian's headless chromium
signs in with the onboarding owner's tokens, opens the device page and saves a PNG.

Usage: python scripts/screenshot_home_assistant.py [--out docs/home-assistant.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from testkit.broker import Broker
from testkit.browser import Chromium
from testkit.home_assistant import HASS, HomeAssistant
from testkit.net import wait_until
from testkit.page import running

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import generate_keypair, load_private_key, load_public_key
from agent.bundles.store import Store
from agent.hardware.board import probe

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "tests/fakes/jetson-orin-nano"
DEVICE = "gate-7"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs/home-assistant.png")
    args = parser.parse_args()
    if not HASS.exists():
        print(f"no Home Assistant core at {HASS}: run bash scripts/setup.sh dev", file=sys.stderr)
        return 2
    board = probe(TREE)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bundle = folder / "demo-1.0.0.bundle"
        private, public = generate_keypair(folder / "keys")  # signed, as in the field: no warning shown
        key = load_private_key(private)
        build_bundle([REPO / "agent/demo/demo_detector.onnx"], bundle, name="demo", version="1.0.0", key=key)
        install(bundle, Store(folder / "state"), board, InstallPolicy(trusted=[load_public_key(public)]))
        broker = Broker(folder / "broker").start()
        ha = HomeAssistant(folder / "ha", broker.port, frontend=True)
        browser: Chromium | None = None
        try:
            ha.start()
            config = {
                "device": {"id": DEVICE, "group": "docks"},
                "state_dir": str(folder / "state"),
                "trust_keys": [str(public)],
                "mqtt": {"broker": broker.url},
                "cameras": [
                    {
                        "name": "dock",
                        "source": "synthetic:1",
                        "max_fps": 10,
                        "classes": ["circle", "square"],
                        "lines": [{"name": "gate", "points": [[0, 240], [640, 240]]}],
                        "zones": [{"name": "bay", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
                    }
                ],
                "telemetry": {"interval_s": 2},
                "integrations": {"home_assistant": {"enabled": True, "image_interval_s": 2}},
            }
            with running(config, board, TREE):
                entity = "sensor.gate_7_dock_objects"
                wait_until(lambda: ha.states().get(entity, {}).get("state") not in (None, "unknown"), 120, entity)
                device_id = ha.render(f"{{{{ device_id('{entity}') }}}}").strip()
                browser = Chromium(width=1360, height=1560)
                page = browser.page()
                page.open(ha.url + "/")
                tokens = {
                    **ha.tokens,
                    "hassUrl": ha.url,
                    "clientId": ha.url + "/",
                    "expires": int(time.time() * 1000) + ha.tokens["expires_in"] * 1000,
                }
                page.evaluate(f"localStorage.setItem('hassTokens', {json.dumps(json.dumps(tokens))})")
                page.open(f"{ha.url}/config/devices/device/{device_id}")
                page.wait_for("document.querySelector('home-assistant') !== null", timeout=60)
                time.sleep(15)  # the panel's lazy chunks, the entity cards and the camera image
                page.screenshot(args.out, full_page=False)
        finally:
            if browser is not None:
                browser.close()
            ha.stop()
            broker.stop()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

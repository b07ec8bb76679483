#!/usr/bin/env python3
"""Screenshot the status page as a technician sees it: docs/status-page.png.

A daemon in this process on the Jetson Orin Nano's fake sensor tree (temperature, power rails),
two synthetic cameras (one motion-gated with a mask: the page draws its regions and the mask),
the demo bundle installed twice (so a rollback is offered), a broker configured that nobody runs
(the page lists it as a problem), and the page with credentials; headless chromium (Debian's)
loads it, waits for a minute of charts, and saves a full-page PNG.

With ``--moved`` the camera "gate" is a rendered clip of a fixed camera knocked 10 % sideways
after 4 seconds (testkit.health_clips, judged on every frame with no hold): its card shows the
reference view under the live one (docs/status-page-moved.png).

Usage: python scripts/screenshot_status_page.py [--out docs/status-page.png] [--seconds 60] [--moved]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from testkit.browser import Chromium
from testkit.net import free_port
from testkit.page import basic, running

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.store import Store
from agent.hardware.board import probe

REPO = Path(__file__).resolve().parent.parent

TREE = REPO / "tests/fakes/jetson-orin-nano"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default docs/status-page.png (--moved: -moved.png)")
    parser.add_argument("--moved", action="store_true", help="the camera gate's view moved (camera health)")
    parser.add_argument("--seconds", type=float, default=60.0, help="history gathered before the screenshot")
    args = parser.parse_args()
    args.out = args.out or REPO / ("docs/status-page-moved.png" if args.moved else "docs/status-page.png")
    board = probe(TREE)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for version, model in (("1.0.0", "demo_detector_int8_qdq.onnx"), ("1.1.0", "demo_detector.onnx")):
            bundle = folder / f"demo-{version}.bundle"
            build_bundle([REPO / "agent/demo" / model], bundle, name="demo", version=version, key=None)
            install(bundle, Store(folder / "state"), board, InstallPolicy(allow_unsigned=True))
        gate: dict[str, object] = {"name": "gate", "source": "synthetic:2", "fps": 8}
        if args.moved:
            from testkit.health_clips import clip
            from testkit.real_models import write_clip

            frames = (frame for frame, _ in clip("shifted", 3000, at=32, width=640, height=360))
            video = write_clip(folder / "knocked.avi", frames, fps=8)
            health = {"interval_s": 0.001, "hold_s": 0, "reference_after_s": 0}
            gate = {"name": "gate", "source": str(video), "loop": False, "max_fps": 8, "health": health}
        (folder / "password").write_text("technician\n")
        port = free_port()
        config = {
            "device": {"id": "gate-7", "group": "docks"},
            "state_dir": str(folder / "state"),
            "allow_unsigned": True,
            "mqtt": {"broker": f"mqtt://127.0.0.1:{free_port()}", "reconnect_max_s": 5},
            "cameras": [
                {
                    "name": "dock",
                    "source": "synthetic:1",
                    "fps": 12,
                    "max_fps": 10,
                    "motion": {"enabled": True, "masks": [[[440, 0], [640, 0], [640, 120], [440, 120]]]},
                },
                gate,
            ],
            "telemetry": {"interval_s": 2},
            "status_page": {
                "listen": f"127.0.0.1:{port}",
                "username": "tech",
                "password_file": str(folder / "password"),
            },
        }
        with running(config, board, TREE):
            browser = Chromium(width=1360, height=1000)
            try:
                page = browser.page()
                page.headers(basic("tech", "technician"))
                time.sleep(args.seconds)
                page.open(f"http://127.0.0.1:{port}/")
                page.wait_for(
                    "window.edgeAgent.history.ts.length > 5 && document.querySelectorAll('canvas').length >= 4"
                )
                if args.moved:
                    page.wait_for("!document.querySelector('[data-camera=gate] .moved').hidden")
                shown = "[...document.querySelectorAll('img.snapshot')].filter(i => !i.closest('.moved[hidden]'))"
                page.wait_for(f"{shown}.every(i => i.complete && i.naturalWidth)")
                time.sleep(6)  # the events and the log (every 5 s)
                page.wait_for("[...document.querySelectorAll('canvas.motion-overlay')].some(c => +c.dataset.regions)")
                page.screenshot(args.out)
            finally:
                browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End to end: the status page of a running agent in Debian's headless chromium and over real HTTP."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit import FAKES
from testkit.browser import Chromium
from testkit.bundles import install_versions
from testkit.camera_stream import MjpegStream
from testkit.net import free_port, wait_until
from testkit.page import basic, http, running
from testkit.quality_records import quality, rate_camera, shadow

from agent import __version__ as AGENT_VERSION
from agent.bundles.record import Deployment, State
from agent.daemon.agent import Agent
from agent.errors import ErrorCode, ErrorInfo
from agent.hardware.board import probe
from agent.mqtt.protocol import PROTOCOL

TREE = FAKES / "laptop-battery"


AUTH = basic("tech", "s3cret pass")
#: cam0's motion mask, frame pixels: the top right of its 640x480 frames
MASK = [[480, 0], [640, 0], [640, 160], [480, 160]]


@dataclass
class Served:
    agent: Agent
    url: str  # http://127.0.0.1:PORT
    camera: MjpegStream


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, bundles: dict[str, Path], keys: dict[str, Path]
) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("page")
    board = probe(TREE)
    install_versions(folder / "state", keys, bundles, board)
    (folder / "password").write_text("s3cret pass\n")
    camera, port = MjpegStream(fps=10), free_port()
    config = {
        "device": {"id": "page-1", "group": "lobby"},
        "state_dir": str(folder / "state"),
        "trust_keys": [str(keys["public"])],
        "operator_keys": [str(keys["operator_pub"])],
        "mqtt": {"broker": f"mqtt://127.0.0.1:{free_port()}", "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "cameras": [
            {
                "name": "cam0",
                "source": "synthetic",
                "fps": 12,
                "max_fps": 10,
                "lines": [{"name": "mid", "points": [[0, 240], [640, 240]]}],
                "zones": [{"name": "left", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
                "motion": {"enabled": True, "masks": [MASK]},
                # a baseline and a window of 3.6 s: a score within the module; never a problem
                "drift": {"baseline_h": 0.001, "window_h": 0.001, "threshold": 1.0},
            },
            {
                "name": "door",
                "source": camera.url,
                "max_fps": 10,
                "conf": 0.5,
                "classes": ["square", "hexagon"],
                "drift": {"enabled": False},
            },
        ],
        "telemetry": {"interval_s": 0.5},
        "health": {"stall_s": 2},
        "status_page": {
            "listen": f"127.0.0.1:{port}",
            "username": "tech",
            "password_file": str(folder / "password"),
            "sample_s": 0.5,
        },
    }
    with running(config, board, TREE) as agent:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http(url + "/healthz").status == 200, 30, "the page to answer")
        wait_until(lambda: len([c for c in agent.snapshot().cameras if c.frames > 3]) == 2, 60, "both cameras")
        yield Served(agent, url, camera)
    camera.close()


def status(served: Served) -> dict[str, Any]:
    answer = http(served.url + "/api/status", headers=AUTH)
    assert answer.status == 200, answer.body
    return answer.json()  # type: ignore[no-any-return]


def test_the_page_in_chromium_shows_the_device_live_frames_and_charts(served: Served, chromium: Chromium) -> None:
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    assert page.wait_for("(t => t !== 'edge-agent' && t)(document.getElementById('device').textContent)") == "page-1"
    camera = "document.querySelector('[data-camera=cam0]')"
    fps_text = f"{camera} && {camera}.querySelector('dd').textContent"
    assert float(page.wait_for(fps_text).split()[0]) >= 0  # a number of frames a second
    # the snapshot decoded in the browser, and the same endpoint decodes here
    assert page.wait_for(f"{camera}.querySelector('img').complete && {camera}.querySelector('img').naturalWidth") > 0
    jpeg = http(served.url + "/api/cameras/cam0/snapshot.jpg", headers=AUTH)
    assert jpeg.headers["content-type"] == "image/jpeg"
    image = cv2.imdecode(np.frombuffer(jpeg.body, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[2] == 3
    # the charts: uPlot drew lines on canvases (non-blank pixels), with points from the history
    painted = """[...document.querySelectorAll('.chart canvas')].map(c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })"""
    page.wait_for("window.edgeAgent.history.ts.length >= 3")
    counts = page.wait_for(f"(() => {{ const n = {painted}; return n.length >= 4 && n.every(x => x > 500) && n; }})()")
    assert len(counts) >= 4  # temperature, power, one per camera
    assert page.evaluate("[...document.querySelectorAll('.chart-note')].map(n => n.hidden)") == [True, True]
    assert page.evaluate("document.getElementById('board').textContent").count("°C") == 1
    assert f"edge-agent {AGENT_VERSION}" in page.evaluate("document.getElementById('identity').textContent")
    # a later load shows newer numbers: the page is live, not cached. (Not "another FPS value": a
    # camera held at its FPS cap shows the same one load after load.)
    newest = "window.edgeAgent.history.ts.length && window.edgeAgent.history.ts.at(-1)"
    loaded = page.wait_for(newest)

    def reloaded_newer() -> bool:
        page.open(served.url + "/")
        return float(page.wait_for(fps_text).split()[0]) >= 0 and page.wait_for(newest) > loaded

    wait_until(reloaded_newer, 30, "a later load to show newer history", interval=0.5)


def test_the_page_works_when_the_browser_was_given_the_credentials_in_its_address(
    served: Served, chromium: Chromium
) -> None:
    """Opened as ``http://tech:password@127.0.0.1:PORT/`` (no header set by the test: chromium
    answers the Basic challenge with the address's credentials and keeps them): the page's own
    requests must not carry them in their URL, which fetch refuses to construct."""
    page = chromium.page()
    port = served.url.rsplit(":", 1)[1]
    page.open(f"http://tech:s3cret%20pass@127.0.0.1:{port}/")
    shown = """(() => { const offline = document.getElementById('offline');
        if (!offline.hidden) return 'offline: ' + offline.textContent;
        const device = document.getElementById('device').textContent;
        return device !== 'edge-agent' && device; })()"""
    assert page.wait_for(shown) == "page-1"
    camera = "document.querySelector('[data-camera=cam0] img')"
    assert page.wait_for(f"{camera} && {camera}.complete && {camera}.naturalWidth") > 0, "the snapshot loads too"
    assert page.evaluate(f"{camera}.src").startswith(f"http://127.0.0.1:{port}/api/cameras/cam0/snapshot.jpg")
    assert page.wait_for("document.getElementById('events').tBodies[0].rows.length"), "and the slow loop's lists"
    # an action through the page's own request function passes the credentials and same-origin checks
    assert page.evaluate("api('/api/cameras/nope/restart', {method: 'POST'}).catch(e => e.status)") == 404


def test_the_page_shows_each_cameras_line_and_zone_counters(served: Served, chromium: Chromium) -> None:
    """The synthetic shapes bounce across cam0's line and through its zone: the camera's card
    shows the counters, the same numbers /api/status has."""
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    row = """(name => { const dt = [...document.querySelectorAll('[data-camera=cam0] dt')]
        .find(d => d.textContent === name); return dt ? dt.nextElementSibling.textContent : null; })"""
    crossed = page.wait_for(f"(t => t && /^\\d+ in, \\d+ out$/.test(t) && t !== '0 in, 0 out' && t)({row}('line mid'))")
    zone = page.wait_for(f"(t => t && /^\\d+ now, [1-9]\\d* total$/.test(t) && t)({row}('zone left'))")
    assert page.wait_for(f"{row}('objects tracked')") is not None
    shown_in, shown_out = (int(part.split()[0]) for part in crossed.split(", "))
    counters = status(served)["cameras_analytics"]["cam0"]
    (line,) = counters["lines"]
    assert (line["name"], line["in"] >= shown_in, line["out"] >= shown_out) == ("mid", True, True)
    assert counters["zones"][0]["total"] >= int(zone.split(", ")[1].split()[0])
    assert "door" in status(served)["cameras_analytics"], "every camera has its counters, lines or not"
    metrics = http(served.url + "/metrics", headers=AUTH).body.decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    crossed_in = samples[
        ("edge_agent_line_crossings_total", (("camera", "cam0"), ("direction", "in"), ("line", "mid")))
    ]
    assert crossed_in >= line["in"] and ("edge_agent_zone_objects", (("camera", "cam0"), ("zone", "left"))) in samples


#: cam0's overlay read back in the page: how much of the mask's box is painted, how many painted
#: pixels lie outside both the mask and every motion region, and how many are the regions' colour;
#: null until the regions drawn are those of the status the page holds
OVERLAY = """(() => {
    const card = document.querySelector('[data-camera=cam0]');
    if (!card) return null;
    const image = card.querySelector('img'), canvas = card.querySelector('canvas.motion-overlay');
    const motion = window.edgeAgent.status.cameras.find(c => c.name === 'cam0').motion;
    if (!motion || !image.naturalWidth || !motion.regions.length || +canvas.dataset.regions !== motion.regions.length)
        return null;
    const s = Math.min(canvas.width / image.naturalWidth, canvas.height / image.naturalHeight);
    const dx = (canvas.width - image.naturalWidth * s) / 2, dy = (canvas.height - image.naturalHeight * s) / 2;
    const box = ([x0, y0, x1, y1], pad) => [dx + x0 * s - pad, dy + y0 * s - pad, dx + x1 * s + pad, dy + y1 * s + pad];
    const inside = ([x0, y0, x1, y1], x, y) => x >= x0 && x <= x1 && y >= y0 && y <= y1;
    const mask = box([480, 0, 640, 160], 2), regions = motion.regions.map(r => box(r, 3));
    const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let maskPixels = 0, maskPainted = 0, outside = 0, magenta = 0;
    for (let y = 0; y < canvas.height; y++) for (let x = 0; x < canvas.width; x++) {
        const i = (y * canvas.width + x) * 4, painted = d[i + 3] > 0;
        if (d[i] > 200 && d[i + 1] < 120 && d[i + 2] > 150 && d[i + 3] > 200) magenta++;
        if (inside(box([480, 0, 640, 160], -2), x, y)) { maskPixels++; if (painted) maskPainted++; }
        else if (painted && !inside(mask, x, y) && !regions.some(r => inside(r, x, y))) outside++;
    }
    return {mask: maskPainted / maskPixels, outside, magenta, legend: !card.querySelector('.motion-legend').hidden};
})()"""


def test_a_gated_cameras_frame_shows_its_motion_regions_and_masks_and_an_ungated_one_nothing(
    served: Served, chromium: Chromium
) -> None:
    """cam0's motion gate (one mask over the top right) on the synthetic scene's moving shapes:
    /api/status carries its regions and mask in frame pixels, and the page draws both over the
    frame as shown (letterboxed in its box), in their place and nowhere else; door, without a
    gate, has nothing drawn and no legend."""
    document = status(served)
    cameras = {c["name"]: c for c in document["cameras"]}
    assert cameras["door"]["motion"] is None
    motion = cameras["cam0"]["motion"]
    assert motion["masks"] == [MASK] and 0 < motion["inferred_ratio"] <= 1 and 0 <= motion["changed"] <= 1
    assert all(0 <= x0 < x1 <= 640 and 0 <= y0 < y1 <= 480 for x0, y0, x1, y1 in motion["regions"])
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    drawn = page.wait_for(f"(o => o && o.magenta > 0 && o)({OVERLAY})")
    assert drawn["mask"] > 0.95 and drawn["outside"] == 0 and drawn["legend"], drawn
    door = "document.querySelector('[data-camera=door]')"
    page.wait_for(f"{door} && {door}.querySelector('img').naturalWidth")
    blank = f"""(c => c.width > 0 && c.dataset.regions === '0'
        && c.getContext('2d').getImageData(0, 0, c.width, c.height).data.every((v, i) => i % 4 !== 3 || v === 0)
    )({door}.querySelector('canvas.motion-overlay'))"""
    assert page.evaluate(blank) and page.evaluate(f"{door}.querySelector('.motion-legend').hidden")
    gate_row = f"[...{door}.querySelectorAll('dt')].some(d => d.textContent === 'motion gate')"
    assert page.evaluate(gate_row) is False


def test_each_cameras_card_shows_the_thresholds_in_force_and_a_class_the_model_lacks_is_a_problem(
    served: Served, chromium: Chromium
) -> None:
    """door sets conf and classes in agent.yaml (one of them, hexagon, the demo model lacks);
    cam0 keeps what the bundle says: the cards, /api/status and /api/problems say so."""
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    row = """((camera, name) => { const dt = [...document.querySelectorAll(`[data-camera=${camera}] dt`)]
        .find(d => d.textContent === name); return dt ? dt.nextElementSibling.textContent : null; })"""
    door = page.wait_for(f"{row}('door', 'thresholds')")
    assert door == "conf 0.50 · iou 0.45 · max_det 300 (conf, classes from agent.yaml, the rest from the bundle)"
    assert page.wait_for(f"{row}('door', 'classes')") == "square"
    assert page.wait_for(f"{row}('cam0', 'thresholds')") == "conf 0.25 · iou 0.45 · max_det 300 (from the bundle)"
    assert page.wait_for(f"{row}('cam0', 'classes')") == "all"
    cameras = {c["name"]: c["thresholds"] for c in status(served)["cameras"]}
    assert cameras["door"]["conf"] == 0.5 and cameras["door"]["classes"] == ["square"]
    assert cameras["cam0"] == {
        "conf": 0.25, "iou": 0.45, "max_det": 300, "classes": None, "configured": [], "problems": []
    }  # fmt: skip
    problems = http(served.url + "/api/problems", headers=AUTH).json()["problems"]
    (lacking,) = [p for p in problems if "hexagon" in p["message"]]
    assert lacking["check"] == "config" and lacking["status"] == "warn"
    assert lacking["message"].startswith("cameras.1.classes.1: 'hexagon' is not a label of demo 1.1.0")
    assert "cameras[].classes" in lacking["fix"]


def test_each_cameras_card_shows_its_drift_score_and_one_without_drift_nothing(
    served: Served, chromium: Chromium
) -> None:
    """cam0 keeps a drift score (its baseline and window a few seconds long): its card's "drift"
    row reads the score /api/status carries, under its threshold; door, with drift off, has no row."""
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    row = """(camera => { const dt = [...document.querySelectorAll(`[data-camera=${camera}] dt`)]
        .find(d => d.textContent === 'drift'); return dt ? dt.nextElementSibling.textContent : null; })"""
    shown = page.wait_for(f"(t => t && !t.startsWith('no score') && t)({row}('cam0'))")
    (drift,) = status(served)["drift"]
    assert drift["camera"] == "cam0" and drift["score"] is not None and drift["threshold"] == 1.0
    assert re.fullmatch(r"0\.\d\d \(threshold 1\.00\)", shown), shown
    page.wait_for("!!document.querySelector('[data-camera=door] dt')")
    assert page.evaluate(f"{row}('door')") is None


def test_api_status_is_the_agent_snapshot_and_needs_the_credentials(served: Served) -> None:
    assert http(served.url + "/api/status").status == 401
    wrong = http(served.url + "/api/status", headers=basic("tech", "s3cret pasS"))
    assert wrong.status == 401 and wrong.headers["www-authenticate"].startswith("Basic")
    assert http(served.url + "/api/status", headers=basic("Tech", "s3cret pass")).status == 401
    document = status(served)
    assert document["device"] == "page-1" and document["group"] == "lobby"
    assert {c["name"] for c in document["cameras"]} == {"cam0", "door"}
    assert document["sensors"]["battery"]["percent"] == 57
    assert document["broker"]["connected"] is False
    assert http(served.url + "/healthz").status == 200, "/healthz is open for probes"
    answer = http(served.url + "/", headers=AUTH)
    assert b"/static/vendor/uPlot.iife.min.js" in answer.body and b"http" not in answer.body.split(b"<body>")[0]
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_metrics_parse_and_carry_cameras_board_governor_deployment_and_broker(served: Served) -> None:
    answer = http(served.url + "/metrics", headers=AUTH)
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answer.body.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("edge_agent_camera_fps", camera="cam0") > 0
    assert value("edge_agent_camera_latency_seconds", camera="door", stage="total", quantile="0.5") > 0
    assert value("edge_agent_camera_frames_total", camera="door") > 0
    assert value("edge_agent_camera_model_shared_by", camera="door") == 2, "both cameras hold one model"
    assert value("edge_agent_camera_mean_batch", camera="door") >= 1
    assert value("edge_agent_temperature_celsius", zone="x86_pkg_temp") == 52.0
    assert value("edge_agent_power_watts") == pytest.approx(12.119, abs=0.01)
    assert value("edge_agent_battery_percent") == 57
    assert value("edge_agent_governor_thermal", edge_agent_governor_thermal="NORMAL") == 1
    assert value("edge_agent_deployment_state", edge_agent_deployment_state="SUCCEEDED") == 1
    assert value("edge_agent_broker_connected") == 0
    assert "edge_agent_mqtt_queued_messages" in families and "edge_agent_healthy" in families
    assert "edge_agent_outbox_messages" in families and "edge_agent_outbox_oldest_age_seconds" in families
    assert value("edge_agent_outbox_dropped_messages_total", kind="event") == 0
    assert value("edge_agent_info", device="page-1", group="lobby", version=status(served)["agent_version"],
                 board="generic x86_64", runtime="litert", bundle="demo", bundle_version="1.1.0") == 1  # fmt: skip
    assert value("edge_agent_build_info", version=AGENT_VERSION, protocol=str(PROTOCOL)) == 1
    assert status(served)["agent_version"] == AGENT_VERSION


def test_problems_say_in_plain_words_that_the_broker_is_unreachable(served: Served) -> None:
    answer = http(served.url + "/api/problems", headers=AUTH).json()
    assert answer["health"] == {"ok": True, "problems": []}
    broker = next(p for p in answer["problems"] if p["check"] == "broker")
    assert broker["status"] == "warn" and "broker unreachable" in broker["message"]
    assert "detections go on locally" in broker["message"] and "mqtt.broker" in broker["fix"]
    statuses = [p["status"] for p in answer["problems"]]
    assert statuses == sorted(statuses, key=["fail", "warn"].index), "failures come first"


class CrossSite:
    """Another site on another port: its page posts a form to the status page's rollback."""

    def __init__(self, target: str) -> None:
        form = f"""<form id=f method=post action="{target}/api/rollback"></form>
            <script>document.getElementById('f').submit()</script>""".encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(form)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_rollback_needs_the_credentials_and_the_page_own_origin(served: Served, chromium: Chromium) -> None:
    before = status(served)
    version, previous = before["bundle"]["version"], before["previous"]["version"]
    rollback = served.url + "/api/rollback"

    refused = http(rollback, "POST", body=b"{}")
    assert refused.status == 401 and refused.json()["error"]["code"] == "UNAUTHORIZED"
    assert http(rollback, "POST", basic("tech", "wrong"), b"{}").status == 401
    assert http(rollback, "GET", AUTH).status == 405, "actions are POST only"
    forged = http(rollback, "POST", {**AUTH, "Origin": "http://evil.example"}, b"{}")
    assert forged.status == 403 and forged.json()["error"]["code"] == "CROSS_SITE"
    assert http(rollback, "POST", {**AUTH, "Sec-Fetch-Site": "cross-site"}, b"{}").status == 403

    # a real browser holding the credentials visits another site, which posts to the rollback
    other = CrossSite(served.url)
    try:
        page = chromium.page()
        page.headers(AUTH)
        page.open(other.url)
        answer = page.wait_for("document.readyState === 'complete' && location.pathname === '/api/rollback' && "
                               "document.body.innerText")  # fmt: skip
        assert "CROSS_SITE" in answer
    finally:
        other.close()
    assert status(served)["bundle"]["version"] == version, "a refused rollback changed the version"
    assert served.agent.store.info(served.agent.store.current_sha()).version == version  # type: ignore[union-attr]

    done = http(rollback, "POST", {**AUTH, "Content-Type": "application/json"}, b"{}")
    assert done.status == 200, done.body
    assert done.json()["deployment"]["state"] == "ROLLED_BACK" and done.json()["deployment"]["version"] == previous
    after = status(served)
    assert after["bundle"]["version"] == previous and after["previous"]["version"] == version
    wait_until(lambda: all(c["frames"] > 0 for c in status(served)["cameras"]), 30, "the cameras on the old version")


def test_restart_a_camera(served: Served) -> None:
    restart = served.url + "/api/cameras/cam0/restart"
    assert http(restart, "POST", body=b"").status == 401
    answer = http(restart, "POST", AUTH, b"")
    assert answer.status == 200 and answer.json() == {"ok": True, "restarted": ["cam0"]}
    unknown = http(served.url + "/api/cameras/nope/restart", "POST", AUTH, b"")
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "NO_PIPELINE"
    assert http(served.url + "/api/cameras/nope/snapshot.jpg", headers=AUTH).status == 404


def test_healthz_turns_503_while_a_camera_loop_hangs(served: Served) -> None:
    served.camera.stall()  # the network camera stops sending with the connection open: read() blocks
    try:
        hung = wait_until(lambda: (a := http(served.url + "/healthz")).status == 503 and a, 30, "/healthz 503")
        assert hung.json()["ok"] is False
        assert [p for p in hung.json()["problems"] if p.startswith("camera door:")], hung.json()
        problems = http(served.url + "/api/problems", headers=AUTH).json()["problems"]
        assert any(p["check"] == "camera door" and p["status"] == "fail" and "hung" in p["message"] for p in problems)
    finally:
        served.camera.resume()
    wait_until(lambda: http(served.url + "/healthz").status == 200, 30, "/healthz 200 again")


def test_without_credentials_the_page_is_read_only_on_loopback_and_runs_without_broker_or_model(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = {
        "device": {"id": "alone-1"},
        "state_dir": str(tmp_path / "state"),
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic"}],
        "status_page": {"listen": f"127.0.0.1:{port}"},
    }
    with running(config, probe(TREE), TREE) as agent:
        url = f"http://127.0.0.1:{port}"
        document = wait_until(lambda: (a := http(url + "/api/status")).status == 200 and a.json(), 30, "the page")
        assert document["device"] == "alone-1" and document["broker"] is None and document["bundle"] is None
        problems = http(url + "/api/problems").json()["problems"]
        assert any(p["check"] == "model" and "no model is installed" in p["message"] for p in problems)
        assert not any(p["check"] == "broker" for p in problems)
        refused = http(url + "/api/rollback", "POST", body=b"{}")
        assert refused.status == 403 and "status_page.username" in refused.json()["error"]["message"]
        assert http(url + "/api/cameras/cam0/snapshot.jpg").json()["error"]["code"] == "NO_PIPELINE"
        assert agent.store.current_sha() is None


def test_the_deployment_card_shows_what_the_shadow_and_probation_judged(tmp_path: Path, chromium: Chromium) -> None:
    """A record left by a deployment that was shadowed then rolled back blind on probation (built
    by hand): the card shows the shadow's outcome, its agreement per camera, probation's quality
    result per camera, and /api/status and /metrics carry the same."""
    judged = Deployment(
        id="demo-2.0.0-q", sha256="c" * 64, state=State.ROLLED_BACK, name="demo", version="2.0.0",
        error=ErrorInfo(ErrorCode.PROBATION_BLIND, "camera cam0: 0.05 x the previous version"),
        history=((State.QUEUED, 1000.0), (State.ROLLED_BACK, 1400.0)),
        shadow=shadow("agrees", mode="report"),
        quality=quality("blind", cameras=(rate_camera("cam0", 0.05), rate_camera("door", None))),
    )  # fmt: skip
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "deployment.json").write_bytes(judged.to_json())
    port = free_port()
    config = {
        "device": {"id": "judged-1"},
        "state_dir": str(tmp_path / "state"),
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic"}],
        "status_page": {"listen": f"127.0.0.1:{port}"},
    }
    with running(config, probe(TREE), TREE):
        url = f"http://127.0.0.1:{port}"
        document = wait_until(lambda: (a := http(url + "/api/status")).status == 200 and a.json(), 30, "the page")
        assert document["deployment"]["shadow"]["cameras"][1]["agreement"] == 0.91
        assert document["deployment"]["quality"]["outcome"] == "blind"
        page = chromium.page()
        page.open(url + "/")
        card = page.wait_for(
            "(t => t.includes('probation quality') && t)(document.getElementById('deployment').innerText)"
        )
        rows = dict(zip(*[iter(card.splitlines())] * 2, strict=True))
        assert rows["state"] == "ROLLED_BACK" and rows["error"].startswith("PROBATION_BLIND: camera cam0")
        assert rows["shadow"] == "agrees (report only, minimum agreement 0.8, 300 s)"
        assert rows["shadow cam0"] == "agreement 0.95 (precision 0.96, recall 0.94) over 120 frames"
        assert rows["shadow door"] == "agreement 0.91 (precision 0.96, recall 0.94) over 120 frames"
        assert rows["probation quality"] == "blind (minimum ratio 0.5)"
        assert rows["quality cam0"] == "ratio 0.05 (1.250 → 0.063 detections a frame)"
        assert rows["quality door"] == "not judged (1.250 a frame before the swap)"
        assert rows["quality says"].startswith("camera cam0: 40 confident detections")
        metrics = http(url + "/metrics").body.decode()
        assert 'edge_agent_probation_quality_ratio{camera="cam0"} 0.05' in metrics
        assert 'edge_agent_shadow_agreement{camera="door"} 0.91' in metrics


def test_tls_with_a_certificate_file(tmp_path: Path) -> None:
    """HTTPS with the configured certificate and key; the client trusts that certificate."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "page.local")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    port = free_port()
    config = {
        "state_dir": str(tmp_path / "state"),
        "allow_unsigned": True,
        "status_page": {
            "listen": f"0.0.0.0:{port}",
            "username": "tech",
            "password_env": "EDGE_AGENT_TEST_PAGE_PASSWORD",
            "tls": {"cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "key.pem")},
        },
    }
    context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGE_AGENT_TEST_PAGE_PASSWORD", "pw")
        with running(config, probe(TREE), TREE):
            url = f"https://127.0.0.1:{port}/api/status"
            answer = http(url, headers=basic("tech", "pw"), context=context)  # the socket listens once start() returned
            assert answer.status == 200 and answer.json()["state"] == "online"
            assert http(url, context=context).status == 401


def test_rollback_without_a_broker_switches_the_store_and_serves_the_previous_version(
    tmp_path: Path, bundles: dict[str, Path], keys: dict[str, Path]
) -> None:
    """No broker, so no deployer: the page's rollback goes to the store and re-serves the cameras."""
    board, port = probe(TREE), free_port()
    install_versions(tmp_path / "state", keys, bundles, board)
    config = {
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "cameras": [{"name": "cam0", "source": "synthetic"}],
        "status_page": {"listen": f"127.0.0.1:{port}", "username": "tech", "password_env": "EDGE_AGENT_TEST_PW"},
    }
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGE_AGENT_TEST_PW", "s3cret pass")
        with running(config, board, TREE) as agent:
            assert agent.deployer is None and agent.snapshot().serving.runtime == "litert"  # type: ignore[union-attr]
            url = f"http://127.0.0.1:{port}"
            done = http(url + "/api/rollback", "POST", AUTH, b"{}")
            assert done.status == 200 and done.json()["deployment"]["version"] == "1.0.0", done.body
            document = http(url + "/api/status", headers=AUTH).json()
            assert document["bundle"]["version"] == "1.0.0" and document["serving"]["runtime"] == "onnxruntime"
            assert document["deployment"]["state"] == "ROLLED_BACK"
            wait_until(lambda: agent.snapshot().cameras[0].runtime == "onnxruntime", 30, "the camera on 1.0.0")
            again = http(url + "/api/rollback", "POST", AUTH, b"{}")
            assert again.status == 200 and again.json()["deployment"]["version"] == "1.1.0", "back and forth"


def test_the_event_list_shows_the_second_stages_class(served: Served, chromium: Chromium) -> None:
    """An object event with a second stage's class lists it after the label (the page's own
    `renderEvents`, in the browser, on the `events` topic's documents)."""
    page = chromium.page()
    page.headers(AUTH)
    page.open(served.url + "/")
    assert page.wait_for("(t => t !== 'edge-agent' && t)(document.getElementById('device').textContent)") == "page-1"
    base = {"ts": 1764528000, "camera": "gate", "track_id": 7, "type": "update", "confidence": 0.91}
    classified = {**base, "label": "person", "classification": {"label": "helmet", "class_id": 0, "score": 0.97}}
    plain = {**base, "label": "car", "track_id": 8}
    rows = page.evaluate(
        f"(() => {{ renderEvents({json.dumps([plain, classified])});"
        " return [...document.getElementById('events').tBodies[0].rows].map(r => r.cells[1].textContent); })()"
    )
    assert rows[0] == "gate: person → helmet #7 update (0.91)" and rows[1] == "gate: car #8 update (0.91)"


NOTES = "[...document.querySelectorAll('.chart-note')].map(n => n.hidden ? null : n.textContent)"


def test_on_a_board_without_sensors_the_temperature_and_power_charts_say_there_is_nothing_to_draw_and_why(
    tmp_path: Path, chromium: Chromium
) -> None:
    bare = FAKES / "x86-generic"  # no thermal zone, no rail, no battery: a VM's /sys
    port = free_port()
    config = {
        "device": {"id": "bare-1"},
        "state_dir": str(tmp_path / "state"),
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic"}],
        "telemetry": {"interval_s": 0.5},
        "status_page": {"listen": f"127.0.0.1:{port}", "sample_s": 0.5},
    }
    with running(config, probe(bare), bare):
        page = chromium.page()
        page.open(f"http://127.0.0.1:{port}/")
        shown = page.wait_for(f"(n => n.every(t => t && !t.includes('yet')) && n)({NOTES})")
        assert shown == [
            "Nothing to draw: no temperature sensor on this board (no thermal zone in /sys/class/thermal, "
            "no GPU temperature; a VM has none).",
            "Nothing to draw: no power sensor on this board (no input power rail, no PMIC, no battery or UPS).",
        ]
        # the charts have points, every one unknown: the notes stand over empty frames, not over a page still loading
        assert page.wait_for("window.edgeAgent.history.ts.length >= 2")
        assert set(page.evaluate("window.edgeAgent.history.temp_c.concat(window.edgeAgent.history.power_w)")) == {None}
        # the notes are inside the charts' frames, in sight
        inside = """['chart-temp', 'chart-power'].map(id => {
            const frame = document.getElementById(id).getBoundingClientRect();
            const note = document.getElementById(id).querySelector('.chart-note').getBoundingClientRect();
            return frame.width > 0 && note.width > 0 && note.top >= frame.top && note.bottom <= frame.bottom; })"""
        assert page.evaluate(inside) == [True, True]

        def why(kind: str, sensors: dict[str, Any] | None, *columns: list[float | None]) -> Any:
            arguments = ", ".join(json.dumps(a) for a in (kind, sensors, columns))
            return page.evaluate(f"window.edgeAgent.nothingToDraw({arguments})")

        # what other boards' readings say: zones that cannot be read, rails without the input one, a silent battery
        none = {"temp_c": None, "thermal_zones": {}, "power_w": None, "rails": {}, "battery": None}
        unread = {**none, "thermal_zones": {"cpu-thermal": None, "vcgencmd": None}}
        assert why("temp", unread, [None]) == (
            "Nothing to draw: the thermal zones (cpu-thermal, vcgencmd) give no reading; "
            "can the agent's user read them?"
        )
        agx = {**none, "rails": {"VDD_GPU_SOC": {}, "VDD_CPU_CV": {}}}
        assert why("power", agx, [None], [None]) == (
            "Nothing to draw: no input power rail on this board; "
            "its rails (VDD_GPU_SOC, VDD_CPU_CV) measure parts of it only."
        )
        silent = {**none, "battery": {"percent": None, "status": "Unknown"}}
        assert why("power", silent, [None], [None]).startswith("Nothing to draw: the battery reports no charge")
        assert why("temp", None, []) == "Nothing to draw yet: the sensors have not been read."
        # something to draw, or about to be: no note
        assert why("temp", none, [None, 41.5]) is None
        assert why("temp", {**none, "temp_c": 41.5}, []) is None
        assert why("power", {**none, "battery": {"percent": 80, "status": "Full"}}, [None], [None]) is None


def test_a_moved_camera_shows_its_reference_beside_the_live_view_in_chromium(
    tmp_path: Path, bundles: dict[str, Path], keys: dict[str, Path], chromium: Chromium
) -> None:
    """A clip of a fixed camera knocked 10 % sideways halfway (testkit.health_clips), judged on
    every frame with no hold: its card in the browser shows the reference view, the JPEG is the
    check's grey copy, "moved" is a problem with what to do, and accepting the new view is an
    action of the page (refused without the login)."""
    from testkit.health_clips import clip
    from testkit.real_models import write_clip

    board = probe(TREE)
    install_versions(tmp_path / "state", keys, bundles, board)
    video = write_clip(tmp_path / "knocked.avi", (frame for frame, _ in clip("shifted", 80, at=40)), fps=10)
    (tmp_path / "password").write_text("s3cret pass\n")
    port = free_port()
    health = {"interval_s": 0.001, "hold_s": 0, "reference_after_s": 0}  # every frame, the last good one kept
    config = {
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "cameras": [{"name": "gate", "source": str(video), "loop": False, "health": health}],
        "status_page": {"listen": f"127.0.0.1:{port}", "username": "tech", "password_file": str(tmp_path / "password")},
    }
    url = f"http://127.0.0.1:{port}"
    with running(config, board, TREE):
        wait_until(lambda: http(url + "/healthz").status == 200, 30, "the page to answer")

        def moved() -> bool:
            cameras = http(url + "/api/status", headers=AUTH).json()["cameras"]
            return bool(cameras and cameras[0]["health"] and cameras[0]["health"]["problems"])

        wait_until(moved, 60, "the camera judged moved")
        (camera,) = http(url + "/api/status", headers=AUTH).json()["cameras"]
        assert [p["kind"] for p in camera["health"]["problems"]] == ["moved"]
        page = chromium.page()
        page.headers(AUTH)
        page.open(url + "/")
        card = "document.querySelector('[data-camera=gate]')"
        assert page.wait_for(f"{card} && !{card}.querySelector('.moved').hidden") is True
        width = page.wait_for(f"{card}.querySelector('img.reference').complete && "
                              f"{card}.querySelector('img.reference').naturalWidth")  # fmt: skip
        assert width == 160, "the check's grey copy"
        assert "Accept the new view" in page.evaluate(f"{card}.querySelector('.moved').textContent")
        listed = "document.getElementById('events').textContent"
        assert page.wait_for(f"{listed}.includes('camera gate: moved since') && {listed}")
        jpeg = http(url + "/api/cameras/gate/reference.jpg", headers=AUTH)
        assert jpeg.status == 200 and jpeg.headers["content-type"] == "image/jpeg"
        assert http(url + "/api/cameras/gate/reference.jpg").status == 401
        accept = url + "/api/cameras/gate/accept-view"
        assert http(accept, "POST", body=b"{}").status == 401
        done = http(accept, "POST", {**AUTH, "Content-Type": "application/json"}, b"{}")
        assert done.status == 200 and done.json() == {"ok": True, "camera": "gate"}


def test_the_samples_table_lists_each_camera_keeping_samples_as_the_agent_counts_them(
    tmp_path: Path, bundles: dict[str, Path], keys: dict[str, Path], chromium: Chromium
) -> None:
    """Three cameras: gate keeps every frame at random but at most one an hour (so exactly one
    sample), yard keeps samples but none of its frames qualify, shed keeps none. The page's
    samples table in chromium has a row per camera keeping samples, rendered from the agent's
    own count and size: gate 1 (now), yard 0 (none yet), no row for shed."""
    board = probe(TREE)
    install_versions(tmp_path / "state", keys, bundles, board)
    (tmp_path / "password").write_text("s3cret pass\n")
    port = free_port()
    one = {"enabled": True, "random_share": 1.0, "min_interval_s": 3600}
    config = {
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "cameras": [
            {"name": "gate", "source": "synthetic:3", "fps": 10, "samples": one},
            {"name": "yard", "source": "synthetic:4", "fps": 10, "samples": {"enabled": True, "random_share": 0}},
            {"name": "shed", "source": "synthetic:5", "fps": 10},
        ],
        "status_page": {"listen": f"127.0.0.1:{port}", "username": "tech", "password_file": str(tmp_path / "password")},
    }
    url = f"http://127.0.0.1:{port}"
    with running(config, board, TREE) as agent:
        wait_until(lambda: http(url + "/healthz").status == 200, 30, "the page to answer")
        kept = wait_until(
            lambda: (k := http(url + "/api/samples", headers=AUTH).json())["gate"]["count"] and k, 60, "a sample"
        )
        page = chromium.page()
        page.headers(AUTH)
        page.open(url + "/")
        rows = """[...document.querySelectorAll('#samples tbody tr')].map(r => [r.dataset.camera,
            ...[...r.cells].map(c => c.textContent)])"""
        shown = page.wait_for(f"!document.getElementById('samples-section').hidden && ({rows}).length && {rows}")
        assert agent.samples is not None and agent.samples.summary()["gate"][0] == 1
    assert kept["gate"]["count"] == 1 and kept["yard"] == {"count": 0, "bytes": 0, "newest": None}
    assert set(kept) == {"gate", "yard"}, "shed keeps no samples"
    size = f"{kept['gate']['bytes'] / 1048576:.1f} MiB"
    assert [row[:4] for row in shown] == [["gate", "gate", "1", size], ["yard", "yard", "0", "0.0 MiB"]], shown
    assert re.fullmatch(r"\d+ s ago", shown[0][4]) and shown[1][4] == "none yet", shown

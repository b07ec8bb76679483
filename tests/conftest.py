"""The fixtures of every test: the COCO models in ../shared/models, sample photos, small ONNX
builders, signing keys and demo bundles, a real mosquitto with a watching client and agent
processes, headless chromium, the TensorRT test double. Helpers that are not fixtures live in
`testkit` (tests/support/), which the benchmarks share."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit import DEMO_MODELS, SHARED_MODELS
from testkit.agent_process import PROBE_CACHE_ENV, AgentProcess, agent_config
from testkit.broker import SMALL_PACKET, Broker, Watcher
from testkit.browser import Chromium
from testkit.needs import missing, required
from testkit.onnx_models import backbone_model
from testkit.optimise import write_frames
from testkit.trt_double import DOUBLE, TensorRTInProcess, TrtDouble, forget_tensorrt

from agent.bundles.archive import Limits, Verified, build_bundle, unpack, verify_unpacked
from pipelines.sources.synthetic import SyntheticScene


def pytest_configure(config: pytest.Config) -> None:
    required()  # a misspelt EDGE_AGENT_REQUIRE stops the run before any test


#: fixtures that start a process that serves (a broker, an agent, a browser, an HTTP server)
DAEMON_FIXTURES = frozenset({"broker", "small_broker", "watcher", "agents", "chromium", "range_server"})
#: folders under tests/ whose every test starts processes, runs a script or a whole install
DAEMON_FOLDERS = frozenset({"e2e", "bench", "scripts", "systemd", "deploy"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `daemons` every test that starts processes (by its folder or its fixtures) or is an
    `install`: `scripts/test.sh --quick` leaves them out (docs/testing.md, "Tiers"). Then run the
    `long` tests first, longest first: pytest-xdist hands tests out in this order, so the
    longest start at once on every worker instead of one of them ending the run alone."""
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0]
        fixtures = set(getattr(item, "fixturenames", ()))
        if folder in DAEMON_FOLDERS or fixtures & DAEMON_FIXTURES or item.get_closest_marker("install"):
            item.add_marker(pytest.mark.daemons)
    items.sort(key=long_seconds, reverse=True)  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def shared_probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The agents of this worker's tests (`agent_config`, and the scripts the tests run that use
    it) keep the runtime probe's answer in one file of the worker's own base folder: the first
    probes, the rest take it back while its key holds (runtimes/probe_cache.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PROBE_CACHE_ENV, str(tmp_path_factory.getbasetemp() / "runtime-probe.json"))
        yield


def long_seconds(item: pytest.Item) -> float:
    """A `long` test's wall seconds as its marker says (0 for any other test)."""
    marker = item.get_closest_marker("long")
    return float(marker.kwargs["seconds"]) if marker is not None else 0.0


@pytest.fixture(scope="session")
def gst() -> str:
    """gst-launch-1.0 with the y4menc element (gstreamer1.0-tools and -plugins-good): its path."""
    path = shutil.which("gst-launch-1.0")
    inspect = shutil.which("gst-inspect-1.0")
    if path is None or inspect is None or subprocess.run([inspect, "y4menc"], capture_output=True).returncode:
        missing("gst", "gst-launch-1.0 with y4menc is not installed (scripts/setup.sh dev installs it)")
    return path


@pytest.fixture(scope="session")
def ffmpeg() -> str:
    """ffmpeg on PATH: its path."""
    path = shutil.which("ffmpeg")
    if path is None:
        missing("ffmpeg", "ffmpeg is not installed (scripts/setup.sh dev installs it)")
    return path


@pytest.fixture(scope="session")
def shared_models() -> Path:
    """The folder of real COCO models; tests using it skip when it is absent."""
    if not (SHARED_MODELS / "README.md").is_file():
        missing("models", f"COCO test models not found at {SHARED_MODELS} (set EDGE_AGENT_SHARED_MODELS)")
    return SHARED_MODELS


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """scikit-image's bundled sample photos written as PNG files (BGR on disk as OpenCV writes)."""
    from skimage import data

    folder = tmp_path_factory.mktemp("photos")
    paths = {}
    for name in ("astronaut", "chelsea", "coffee", "camera"):
        image = getattr(data, name)()
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        path = folder / f"{name}.png"
        cv2.imwrite(str(path), image[..., ::-1])
        paths[name] = path
    return paths


OnnxBuilder = Callable[..., Path]


@pytest.fixture
def constant_model(tmp_path: Path) -> OnnxBuilder:
    """Build an ONNX model with one image input whose single output is a constant array.

    ``constant_model(output, input_shape=(1, 3, 64, 64), metadata=None, name="m")`` returns the
    path. The input is added (times zero) to the output so the graph really consumes it.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def build(
        output: np.ndarray,
        input_shape: tuple[int | str, ...] = (1, 3, 64, 64),
        metadata: dict[str, str] | None = None,
        name: str = "model",
    ) -> Path:
        const = numpy_helper.from_array(output.astype(np.float32), "const")
        zero = numpy_helper.from_array(np.zeros((1,), np.float32), "zero")
        nodes = [
            helper.make_node("ReduceSum", ["images"], ["total"], keepdims=0),
            helper.make_node("Mul", ["total", "zero"], ["nothing"]),
            helper.make_node("Add", ["const", "nothing"], ["output0"]),
        ]
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("images", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(output.shape))],
            initializer=[const, zero],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        for key, value in (metadata or {}).items():
            model.metadata_props.add(key=key, value=value)
        onnx.checker.check_model(model)
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        return path

    return build


@pytest.fixture(scope="session")
def heavy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`backbone_model`: its sessions take memory as a real model's do (about 1.4 GMAC a frame)."""
    return backbone_model(tmp_path_factory.mktemp("heavy") / "backbone.onnx")


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`backbone_model` with 80 more layers (about 20 GMAC a frame, 20 times the plain backbone's
    time here), so it stays well below 30 FPS on any CPU the tests run on (the plain backbone,
    1.4 GMAC, kept up with 30 FPS on CI's cores)."""
    return backbone_model(tmp_path_factory.mktemp("slow") / "slow.onnx", repeats=80)


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fleet signing key pair (private, public), an operator's key pair for control
    (operator, operator_pub) and a stranger's private key (other)."""
    from agent.bundles.signing import generate_keypair

    folder = tmp_path_factory.mktemp("keys")
    private, public = generate_keypair(folder / "fleet")
    operator, operator_pub = generate_keypair(folder / "operator")
    other, _ = generate_keypair(folder / "stranger")
    return {"private": private, "public": public, "operator": operator, "operator_pub": operator_pub, "other": other}


@pytest.fixture
def operator(keys: dict[str, Path]) -> Ed25519PrivateKey:
    """The operator's private key, for signing control by hand."""
    from agent.bundles.signing import load_private_key

    return load_private_key(keys["operator"])


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> dict[str, Path]:
    """Signed demo bundles: v1 (INT8 Q/DQ ONNX) and v2 (INT8 TFLite)."""
    from agent.bundles.archive import build_bundle
    from agent.bundles.signing import load_private_key

    folder = tmp_path_factory.mktemp("bundles")
    key = load_private_key(keys["private"])
    v1 = folder / "demo-1.0.0.bundle"
    v2 = folder / "demo-1.1.0.bundle"
    build_bundle([DEMO_MODELS / "demo_detector_int8_qdq.onnx"], v1, name="demo", version="1.0.0", key=key)
    build_bundle([DEMO_MODELS / "demo_detector_int8.tflite"], v2, name="demo", version="1.1.0", key=key)
    return {"v1": v1, "v2": v2}


@pytest.fixture
def range_server() -> Iterator[Callable[..., str]]:
    """``range_server(path, drop_after=None, ignore_range=False)`` serves `path`; returns its URL."""
    from testkit.net import RangeServer

    servers: list[RangeServer] = []

    def serve(path: Path, **options: Any) -> str:
        servers.append(RangeServer(path, **options))
        return servers[-1].url

    yield serve
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unsigned demo bundle with the FP32 ONNX and the INT8 TFLite artifacts (the matrix's rows)."""
    out = tmp_path_factory.mktemp("matrix") / "demo.bundle"
    models = [DEMO_MODELS / "demo_detector.onnx", DEMO_MODELS / "demo_detector_int8.tflite"]
    build_bundle(models, out, name="demo", version="1.0.0")
    return out


@pytest.fixture
def unpacked(tmp_path: Path, demo_bundle: Path) -> Verified:
    """`demo_bundle` unpacked and verified."""
    folder = tmp_path / "demo"
    folder.mkdir()
    unpack(demo_bundle, folder, Limits())
    return verify_unpacked(folder, (), allow_unsigned=True)


# -- a real mosquitto, a client watching it, agent processes --------------------------------------


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """A started `Broker`; a test marked ``broker_config(TEXT)`` adds TEXT to its mosquitto.conf."""
    marker = request.node.get_closest_marker("broker_config")
    broker = Broker(tmp_path / "broker", extra=marker.args[0] if marker else "").start()
    yield broker
    broker.stop()


@pytest.fixture
def watcher(broker: Broker) -> Iterator[Watcher]:
    watcher = Watcher(broker, ["edge/#"])
    yield watcher
    watcher.close()


@pytest.fixture
def operator_key(keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fleet CLI signs desired documents and commands with the operator's key."""
    monkeypatch.setenv("EDGE_AGENT_OPERATOR_KEY", str(keys["operator"]))
    return keys["operator"]


@pytest.fixture
def agents(tmp_path: Path, broker: Broker, keys: dict[str, Path]) -> Iterator[Callable[..., AgentProcess]]:
    """``agents(device, group=None, env=None, max_files=None, **config)`` starts an agent process
    that obeys the operator's key (`max_files`: its ``ulimit -n``)."""
    started: list[AgentProcess] = []

    def start(
        device: str,
        group: str | None = None,
        env: dict[str, str] | None = None,
        max_files: int | None = None,
        **config: Any,
    ) -> AgentProcess:
        path = agent_config(tmp_path, broker, device, keys["public"], group, keys["operator_pub"], **config)
        agent = AgentProcess(path, env, max_files=max_files).start()
        started.append(agent)
        return agent

    yield start
    running = [agent for agent in started if agent.alive()]
    for agent in running:
        agent.terminate()  # all at once: each then stops in its own time, side by side
    for agent in running:
        agent.stop()


# -- headless chromium and the TensorRT test double --------------------------------------------


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    browser = Chromium()
    yield browser
    browser.close()


@pytest.fixture
def trt_double(monkeypatch: pytest.MonkeyPatch) -> Iterator[TrtDouble]:
    """The TensorRT test double installed for one test (`testkit.trt_double`)."""
    from runtimes import cuda_memory, isolation

    forget_tensorrt()
    monkeypatch.syspath_prepend(str(DOUBLE))
    import tensorrt
    from tensorrt import _double

    _double.GPU = _double.FakeGpu()
    memory = _double.HostDeviceMemory()
    _double.device = memory
    _double.builds.clear()
    _double.build_gate, _double.output_offset = None, 0.0
    monkeypatch.setattr(_double, "UNSUPPORTED_OPS", set(_double.UNSUPPORTED_OPS))
    monkeypatch.setattr(cuda_memory, "IMPLEMENTATIONS", (("host double", lambda device: memory),))
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", TensorRTInProcess(isolation.PROCESS_RUNNER))
    try:
        yield TrtDouble(tensorrt, _double, memory)
    finally:
        _double.device = None
        forget_tensorrt()


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Broker]:
    """mosquitto that takes no packet over `SMALL_PACKET` bytes (and says so in its CONNACK)."""
    broker = Broker(tmp_path / "small", extra=f"max_packet_size {SMALL_PACKET}\n").start()
    yield broker
    broker.stop()


# -- the operator's build tools: calibration and validation images ------------------------------


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic scenes (640x480, five shapes each) as PNG files: calibration and validation."""
    frames = [SyntheticScene(seed=7_000 + i, num_shapes=5).render(i * 9)[0] for i in range(8)]
    return write_frames(tmp_path_factory.mktemp("opt") / "scenes", frames)


@pytest.fixture(scope="module")
def blank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deliberately bad calibration set: black frames."""
    return write_frames(tmp_path_factory.mktemp("opt") / "blank", [np.zeros((480, 640, 3), np.uint8)] * 8)

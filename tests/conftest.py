"""Shared fixtures: the COCO models in ../shared/models, sample photos, small ONNX builders."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from tests.needs import missing, required

REPO = Path(__file__).resolve().parent.parent
SHARED_MODELS = Path(os.environ.get("EDGE_AGENT_SHARED_MODELS", REPO.parent / "shared" / "models"))
FAKES = Path(__file__).resolve().parent / "fakes"

pytest_plugins = ["tests.fleet_helpers"]  # broker, watcher, agents and operator_key fixtures


def pytest_configure(config: pytest.Config) -> None:
    required()  # a misspelt EDGE_AGENT_REQUIRE stops the run before any test


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


def backbone_model(path: Path, repeats: int = 0) -> Path:
    """Write an ONNX detector shaped like a small YOLO backbone at 640x640 to `path`: nine 3x3
    convolutions with SiLU, strides down to 20x20, random weights; `repeats` more 3x3 64-channel
    convolutions at 80x80 follow the fifth, sharing its weight (about 0.24 GMAC each, so the
    model's cost grows, not its file, nor the weights ONNX Runtime prepacks per node). It decodes
    as YOLOv8 with 4 classes (output ``(1, 8, 400)``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    layers = [(3, 16, 2), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1)]
    layers += [(128, 256, 2), (256, 256, 1)]
    nodes, initializers, previous = [], [], "images"

    def conv_silu(name: str, weights: str, stride: int) -> None:
        nonlocal previous
        nodes.extend(
            [
                helper.make_node(
                    "Conv", [previous, weights], [f"c{name}"], pads=[1, 1, 1, 1], strides=[stride, stride]
                ),
                helper.make_node("Sigmoid", [f"c{name}"], [f"s{name}"]),
                helper.make_node("Mul", [f"c{name}", f"s{name}"], [f"a{name}"]),
            ]
        )
        previous = f"a{name}"

    for i, (cin, cout, stride) in enumerate(layers):
        weights = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weights, f"w{i}"))
        conv_silu(str(i), f"w{i}", stride)
        for r in range(repeats if i == 4 else 0):  # (64, 64, 1) at 80x80
            conv_silu(f"r{r}", "w4", 1)
    initializers += [
        numpy_helper.from_array((rng.standard_normal((8, 256, 1, 1)) * 0.1).astype(np.float32), "head"),
        numpy_helper.from_array(np.array([1, 8, -1], np.int64), "shape"),
    ]
    nodes += [
        helper.make_node("Conv", [previous, "head"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "backbone",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 8, 400])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


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


DEMO_MODELS = REPO / "agent" / "demo"


def write_video(path: Path, frames: int, size: tuple[int, int] = (160, 120), seed: int = 0) -> Path:
    """An MJPG .avi of synthetic frames (every frame a keyframe, so truncation breaks it mid-way)."""
    from pipelines.synthetic import SyntheticScene

    scene = SyntheticScene(width=size[0], height=size[1], num_shapes=3, seed=seed, size_range=(20, 50))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 30.0, size)
    for i in range(frames):
        writer.write(scene.render(i)[0])
    writer.release()
    return path


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
    from tests.mqtt_tools import RangeServer

    servers: list[RangeServer] = []

    def serve(path: Path, **options: Any) -> str:
        servers.append(RangeServer(path, **options))
        return servers[-1].url

    yield serve
    for server in servers:
        server.close()

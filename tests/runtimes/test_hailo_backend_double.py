"""`testkit.hailo_double` against HailoRT's Python API as read (pyhailort.py of hailo-ai/hailort
v4.18.0 and v5.2.0, transcribed in `hailo_double.API`): the names and parameters the backend
calls, the shapes and dtypes of the streams, and the structure of an NMS output. A double that
drifted from the API would let the backend pass here and fail on a HAT+."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, hailo_double

import runtimes.hailo_backend

DEMO = DEMO_MODELS / "demo_detector.onnx"


def _member(path: str) -> object:
    target: object = hailo_double
    for part in path.split("."):
        target = getattr(target, part)
    return target


def _plain(member: object) -> str:
    """A signature as pyhailort.py writes it: names, ``*`` and defaults, no annotations."""
    parts, keyword_only = [], False
    for p in inspect.signature(member).parameters.values():  # type: ignore[arg-type]
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        parts.append(p.name + ("" if p.default is p.empty else f"={p.default!r}"))
    return f"({', '.join(parts)})"


@pytest.mark.parametrize("name", sorted(hailo_double.API))
def test_the_double_has_the_api_s_signatures(name: str) -> None:
    # fails on: a parameter renamed, added or dropped in the double that HailoRT does not have
    read = hailo_double.API[name]
    want = read[1] if isinstance(read, tuple) else read  # 5.2's names where 4.18 differs
    assert _plain(_member(name)) == want


@pytest.mark.parametrize("owner", sorted(hailo_double.PROPERTIES))
def test_the_double_s_properties_are_properties(owner: str) -> None:
    for name in hailo_double.PROPERTIES[owner]:
        assert isinstance(inspect.getattr_static(_member(owner), name), property), f"{owner}.{name}"


def test_the_backend_calls_what_differs_between_releases_positionally() -> None:
    # fails on: create_infer_model(hef, name=...) (4.18 calls it network_name) or any keyword HailoRT lacks
    tree = ast.parse(Path(runtimes.hailo_backend.__file__).read_text())
    calls = {
        node.func.attr: [k.arg for k in node.keywords]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert calls["create_infer_model"] == []
    assert calls["run"] == [] and calls["create_bindings"] == ["output_buffers"]


def test_streams_and_the_nms_output_have_hailort_s_shapes_and_structure(tmp_path: Path) -> None:
    # fails on: an NMS buffer not in HAILO_NMS_BY_CLASS layout, boxes not (n, 5) per class
    with hailo_double.installed():
        hef = hailo_double.write_hef(tmp_path / "m.hef", DEMO, nms=True, max_bboxes_per_class=10)
        model = hailo_double.VDevice(hailo_double.VDevice.create_params()).create_infer_model(str(hef))
        assert model.input().shape == [320, 320, 3] and str(model.input().format.type) == "FormatType.UINT8"
        (out,) = model.outputs
        assert out.is_nms and out.shape == [3 * (1 + 5 * 10)], "the by-class buffer's flat size (bindings_common.hpp)"
        with model.configure() as configured:
            bindings = configured.create_bindings(output_buffers={out.name: np.empty(out.shape, np.float32)})
            with pytest.raises(hailo_double.HailoRTException, match="C_CONTIGUOUS"):
                bindings.input().set_buffer(np.zeros((320, 320, 6), np.uint8)[:, :, ::2])
            bindings.input().set_buffer(np.full((320, 320, 3), 128, np.uint8))
            configured.run([bindings], 1000)
            per_class = bindings.output().get_buffer()
    assert isinstance(per_class, list) and len(per_class) == 3
    assert all(boxes.ndim == 2 and boxes.shape[1] == 5 for boxes in per_class)

"""rknn-toolkit2's side of ``bundle build --rknn``: run by `agent.optimise.rknn_build` as a subprocess (``python -I``)
of the toolkit's own environment (it pins numpy < 2 and an old torch: never the agent's), so it
imports nothing of edge-agent. It converts an ONNX model for one Rockchip platform, INT8 with
the calibration tensors given (``.npy``, the pipeline's NCHW float tensors as they are) or FP16, and
runs the toolkit's x86 simulator on the probe tensors given, writing its outputs.

    python rknn_convert.py --onnx M.onnx --platform rk3588 --out M.rknn \\
        --inputs '[{"name": "images", "shape": [1, 3, 320, 320]}]' \\
        [--dataset LIST.txt | --fp16] [--probe IN.npz --outputs OUT.npz]

The input shapes are fixed (the toolkit refuses a dynamic batch): the caller fixes them.

Prints one JSON line last: ``{"toolkit_version": ..., "quantization": "i8" | "fp16"}``. Exit
status 2 with the failing step on stderr when the toolkit refuses (its return code is -1).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from typing import Any


def _check(step: str, code: int) -> None:
    if code != 0:
        print(f"rknn-toolkit2: {step} failed (return code {code}); its log above says why", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--platform", required=True, choices=("rk3588", "rk3566", "rk3568"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--inputs", required=True, help="the inputs' names and fixed shapes, as JSON")
    parser.add_argument("--dataset", help="a text file listing calibration .npy tensors (INT8)")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--probe", help="an .npz of NHWC input tensors for the simulator (arr_0, arr_1, ...)")
    parser.add_argument("--outputs", help="where the simulator's outputs go (.npz: i_j = probe i, output j)")
    args = parser.parse_args(argv)
    if not args.fp16 and not args.dataset:
        parser.error("INT8 needs --dataset (or --fp16)")

    import numpy as np
    from rknn.api import RKNN

    rknn: Any = RKNN(verbose=False)
    # the pipeline's tensor is already normalised (0..1 floats): no mean or scale of the toolkit's
    _check("config", rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]], target_platform=args.platform))
    inputs = json.loads(args.inputs)
    names, shapes = [str(i["name"]) for i in inputs], [[int(d) for d in i["shape"]] for i in inputs]
    _check("load_onnx", rknn.load_onnx(model=args.onnx, inputs=names, input_size_list=shapes))
    _check("build", rknn.build(do_quantization=not args.fp16, dataset=args.dataset))
    _check("export_rknn", rknn.export_rknn(args.out))
    if args.probe:
        _check("init_runtime (simulator)", rknn.init_runtime())  # no target: the x86 simulator
        found: dict[str, Any] = {}
        with np.load(args.probe) as probes:
            for i in range(len(probes.files)):
                result = rknn.inference(inputs=[probes[f"arr_{i}"]], data_format="nhwc")
                if result is None:
                    _check(f"inference of probe {i}", -1)
                for j, value in enumerate(result):
                    found[f"{i}_{j}"] = np.asarray(value, dtype=np.float32)
        np.savez(args.outputs, **found)
    rknn.release()
    version = metadata.version("rknn-toolkit2")
    print(json.dumps({"toolkit_version": version, "quantization": "fp16" if args.fp16 else "i8"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

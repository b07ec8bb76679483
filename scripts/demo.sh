#!/usr/bin/env bash
# The demo: set up .venv, show what the probe finds, run the project's demo detector on a
# synthetic camera frame with ONNX Runtime and LiteRT, benchmark the pipeline on a clip, then
# build, sign and install a demo bundle into a local state directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=demo-out
.venv/bin/python scripts/make_demo_media.py "$out" --frames 150
echo; echo "== edge-agent probe"
.venv/bin/edge-agent probe
echo; echo "== edge-agent detect (ONNX Runtime, FP32)"
.venv/bin/edge-agent detect agent/demo/demo_detector.onnx "$out/scene.png" --save-dir "$out"
echo; echo "== edge-agent detect (LiteRT, INT8)"
.venv/bin/edge-agent detect agent/demo/demo_detector_int8.tflite "$out/scene.png"
echo; echo "== edge-agent bench (pipeline on a 150-frame clip)"
.venv/bin/edge-agent bench agent/demo/demo_detector.onnx --source "$out/scene.mp4"
echo; echo "== a signed demo bundle, installed into $out/state"
[ -f "$out/keys/signing.key" ] || .venv/bin/edge-agent keygen --out "$out/keys"
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector.onnx --model agent/demo/demo_detector_int8.tflite \
  --name demo --version 1.0.0 --key "$out/keys/signing.key" -o "$out/demo-1.0.0.bundle"
.venv/bin/edge-agent bundle inspect "$out/demo-1.0.0.bundle"
.venv/bin/edge-agent install "$out/demo-1.0.0.bundle" --state-dir "$out/state" --trust-key "$out/keys/signing.pub"
.venv/bin/edge-agent status --state-dir "$out/state"
echo; echo "annotated frame: $out/scene.jpg"

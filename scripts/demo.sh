#!/usr/bin/env bash
# The demo: set up .venv, show what the probe finds, run the project's demo detector with ONNX
# Runtime and LiteRT, benchmark the pipeline on a clip, build and sign a demo bundle (and one with
# FP16 / INT8 variants proven against FP32) and measure its optimisation matrix, then the fleet:
# a local mosquitto, the agent on two synthetic cameras sharing one model with thresholds of
# their own (autotune at activation), the bundle pushed over MQTT.
# The broker and the agent keep running for you to look at; `scripts/demo.sh stop` ends them.
# The ports are free ones picked at the start; EDGE_AGENT_DEMO_BROKER_PORT (the broker),
# EDGE_AGENT_DEMO_PAGE_PORT (the status page) and EDGE_AGENT_DEMO_SIM_PORT (the simulated fleet's
# own broker) set them instead (tests/scripts/test_demo.py gives its worker's free ports).
set -euo pipefail
cd "$(dirname "$0")/.."
out=demo-out

stop_fleet() {
  for name in agent mosquitto; do
    if [ -f "$out/$name.pid" ]; then
      kill "$(cat "$out/$name.pid")" 2>/dev/null && echo "stopped $name" || true
      rm -f "$out/$name.pid"
    fi
  done
}
if [ "${1:-}" = stop ]; then stop_fleet; exit 0; fi

scripts/setup.sh
stop_fleet >/dev/null
.venv/bin/python scripts/make_demo_media.py "$out" --frames 150 --stills 16
echo; echo "== edge-agent probe"
.venv/bin/edge-agent probe
echo; echo "== edge-agent telemetry (this machine's sensors, then a Jetson Orin Nano's, from its fake tree)"
.venv/bin/edge-agent telemetry
.venv/bin/edge-agent telemetry --root tests/fakes/jetson-orin-nano
echo; echo "== edge-agent detect (ONNX Runtime, FP32)"
.venv/bin/edge-agent detect agent/demo/demo_detector.onnx "$out/scene.png" --save-dir "$out"
echo; echo "== edge-agent detect (LiteRT, INT8)"
.venv/bin/edge-agent detect agent/demo/demo_detector_int8.tflite "$out/scene.png"
echo; echo "== task models: masks (segmentation) and keypoints (pose) drawn by --save-dir, printed by --json"
.venv/bin/edge-agent detect agent/demo/demo_segment.onnx "$out/scene.png" --save-dir "$out/segment"
.venv/bin/edge-agent detect agent/demo/demo_pose.onnx "$out/scene.png" --save-dir "$out/pose" --json | head -c 400; echo
echo; echo "== edge-agent bench (pipeline on a 150-frame clip)"
.venv/bin/edge-agent bench agent/demo/demo_detector.onnx --source "$out/scene.mp4"
echo; echo "== edge-agent bench --against: the INT8 variant against the FP32 model on the same clip (docs/quality.md)"
.venv/bin/edge-agent bench agent/demo/demo_detector.onnx --against agent/demo/demo_detector_int8.tflite --source "$out/scene.mp4"
echo; echo "== edge-agent detect --track --motion: objects followed through the clip, crossings of a line, the model"
echo "   run only on frames worth looking at (the last line: inferred_frames of frames; docs/cameras.md#motion)"
.venv/bin/edge-agent detect agent/demo/demo_detector.onnx "$out/scene.mp4" --track --motion --line 0,240,640,240 --json | tail -1
if command -v gst-launch-1.0 >/dev/null; then
  echo; echo "== edge-agent bench on a camera pipe (gst-launch-1.0 writing raw frames, docs/cameras.md)"
  .venv/bin/edge-agent bench agent/demo/demo_detector.onnx \
    --source 'gst:videotestsrc num-buffers=90 pattern=ball ! video/x-raw,width=640,height=480'
fi
echo; echo "== a signed demo bundle (its manifest says conf 0.4: every camera's default)"
[ -f "$out/keys/signing.key" ] || .venv/bin/edge-agent keygen --out "$out/keys"            # signs bundles
[ -f "$out/operator/signing.key" ] || .venv/bin/edge-agent keygen --out "$out/operator"    # signs control
export EDGE_AGENT_OPERATOR_KEY="$out/operator/signing.key"  # fleet push, rollback, snapshot sign with it
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector.onnx --model agent/demo/demo_detector_int8.tflite \
  --name demo --version 1.0.0 --conf 0.4 --key "$out/keys/signing.key" -o "$out/demo-1.0.0.bundle"
.venv/bin/edge-agent bundle inspect "$out/demo-1.0.0.bundle"
echo; echo "== the optimisation report: every runtime x artifact this machine can run (TensorRT rows say why not)"
# OpenVINO is an optional extra (docs/openvino.md): installed, its rows join the matrix and autotune
.venv/bin/python -m pip install -q -e ".[openvino]" || echo "(the openvino extra did not install: no OpenVINO rows)"
.venv/bin/edge-agent bench "$out/demo-1.0.0.bundle" --matrix --frames 50

echo; echo "== a second stage: the demo classifier on each tracked square and triangle, every 2 s (docs/bundles.md)"
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector.onnx --model agent/demo/demo_detector_int8.tflite \
  --classifier agent/demo/demo_classify.onnx --classifier agent/demo/demo_classify_int8.tflite \
  --classify-labels circle,square,triangle --classify-for square,triangle --classify-every 2 \
  --name shapes --version 1.0.0 --key "$out/keys/signing.key" -o "$out/shapes-1.0.0.bundle"
.venv/bin/edge-agent bundle inspect "$out/shapes-1.0.0.bundle"
.venv/bin/edge-agent bench agent/demo/demo_detector.onnx --mode runtime --frames 20 --classifier agent/demo/demo_classify.onnx

echo; echo "== bundle build --precisions: FP16 and INT8 variants, each proven against FP32 (docs/optimising.md)"
.venv/bin/python -m pip install -q -e ".[build]"  # onnx, onnxslim, sympy: the operator's build tools
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector.onnx --precisions fp32,fp16,int8 \
  --calibration "$out/calibration" --validation "$out/validation" \
  --name demo-variants --version 1.0.0 --key "$out/keys/signing.key" -o "$out/demo-variants-1.0.0.bundle"
.venv/bin/edge-agent bundle inspect "$out/demo-variants-1.0.0.bundle"
echo "-- a segmentation model's INT8: quantized whole it finds nothing, so it is made again with its head in float"
.venv/bin/edge-agent bundle build --model agent/demo/demo_segment.onnx --precisions fp32,int8 \
  --calibration "$out/calibration" --validation "$out/validation" \
  --name demo-segment --version 1.0.0 --key "$out/keys/signing.key" -o "$out/demo-segment-1.0.0.bundle"

echo; echo "== the fleet: mosquitto, the agent on a synthetic camera, the bundle pushed over MQTT"
free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=${EDGE_AGENT_DEMO_BROKER_PORT:-$(free_port)}
broker="mqtt://127.0.0.1:$port"
mosquitto=$(command -v mosquitto || echo /usr/sbin/mosquitto)
cat > "$out/mosquitto.conf" <<CONF
listener $port 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
persistence false
user $(id -un)
CONF
"$mosquitto" -c "$out/mosquitto.conf" > "$out/mosquitto.log" 2>&1 &
echo $! > "$out/mosquitto.pid"
rm -rf "$out/fleet-state"
page_port=${EDGE_AGENT_DEMO_PAGE_PORT:-$(free_port)}
page="http://127.0.0.1:$page_port"
.venv/bin/edge-agent config example --device-id demo-cam --group demo --broker "$broker" \
  --state-dir "$out/fleet-state" --source synthetic --trust-key "$out/keys/signing.pub" \
  --operator-key "$out/operator/signing.pub" --status-listen "127.0.0.1:$page_port" > "$out/agent.yaml"
sed -i 's/probation_s: 120 /probation_s: 5   /' "$out/agent.yaml"  # a short probation, for the demo
# a second camera: both share one loaded model (docs/cameras.md); cam1 keeps only squares scoring
# above 0.6, cam0 what the bundle says (docs/configuration.md#detection-thresholds-per-camera)
# cam1 also keeps a short clip around each object's start (docs/analytics.md#clips), and infers
# only where something moves, its top right masked (docs/cameras.md#motion: the page draws both)
sed -i 's|^    max_fps: 15$|&\n  - {name: cam1, source: "synthetic:7", max_fps: 15, conf: 0.6, classes: [square], clips: {pre_s: 1, post_s: 2}, motion: {enabled: true, masks: [[[480, 0], [640, 0], [640, 120], [480, 120]]]}}|' "$out/agent.yaml"
.venv/bin/edge-agent config check "$out/agent.yaml"
.venv/bin/edge-agent run --config "$out/agent.yaml" > "$out/agent.log" 2>&1 &
echo $! > "$out/agent.pid"
mosquitto_sub -p "$port" -t edge/demo-cam/status -C 1 -W 30 > /dev/null  # the agent is online
.venv/bin/edge-agent fleet push "$out/demo-1.0.0.bundle" --target group:demo --broker "$broker" --wait 60
echo; echo "== what each camera keeps, on one shared model: the bundle's conf on cam0, agent.yaml's conf and classes on cam1;"
echo "   cam1's motion gate (inferred_ratio: the share of its frames the model ran on)"
curl -s "$page/api/status" | .venv/bin/python -c "
import json, sys
for c in json.load(sys.stdin)['cameras']:
    t = c['thresholds'] or {}
    classes = ', '.join(t['classes']) if t.get('classes') else 'all'
    print(f\"{c['name']}: conf {t.get('conf')}, iou {t.get('iou')}, max_det {t.get('max_det')}, classes {classes}\"
          f\" (set in agent.yaml: {', '.join(t.get('configured', [])) or 'none'})\")
    m = c.get('motion')
    if m:
        print(f\"{c['name']}: motion gate: {m['inferred_ratio']:.0%} of frames inferred, {m['motion_ratio']:.0%} with\"
              f\" motion, {len(m['regions'])} region(s) now, {len(m['masks'])} mask(s) (drawn on the page: $page)\")
"
echo; echo "== an unsigned command, as any client of the broker could send it: refused"
# mosquitto_rr subscribes to the response topic before it publishes: the answer cannot come first
mosquitto_rr -p "$port" -t edge/demo-cam/cmd/rollback -m '{}' -e edge/replies/demo \
  -D publish correlation-data demo-cam -W 10
echo; echo "== a staged rollout: 1.0.1 to the group in two waves 20 s apart, halted (and rolled back) on a failure"
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector.onnx --model agent/demo/demo_detector_int8.tflite \
  --name demo --version 1.0.1 --conf 0.4 --key "$out/keys/signing.key" -o "$out/demo-1.0.1.bundle"
.venv/bin/edge-agent fleet push "$out/demo-1.0.1.bundle" --target group:demo --broker "$broker" --id demo-1.0.1-staged \
  --waves 50%,100% --wave-interval 20s --max-failures 0 --on-halt rollback --wait 90
.venv/bin/edge-agent fleet rollout status demo-1.0.1-staged --broker "$broker"
echo; echo "== a new version judged on live frames before it switches (the INT8 model shadows the serving one) and"
echo "   after (the previous version runs beside it through probation; docs/quality.md)"
.venv/bin/edge-agent bundle build --model agent/demo/demo_detector_int8.tflite \
  --name demo --version 1.0.2 --conf 0.4 --key "$out/keys/signing.key" -o "$out/demo-1.0.2.bundle"
.venv/bin/edge-agent fleet push "$out/demo-1.0.2.bundle" --target group:demo --broker "$broker" --id demo-1.0.2-shadowed \
  --shadow 5s --min-agreement 0.8 --probation-agreement 0.8 --wait 90
# the next telemetry message (interval_s: 10): the agent sends the status, whose FPS fleet status
# shows, right after it
mosquitto_sub -p "$port" -t edge/demo-cam/telemetry -C 1 -W 30 > /dev/null
.venv/bin/edge-agent fleet status --broker "$broker"
.venv/bin/edge-agent fleet snapshot --target device:demo-cam --broker "$broker" -o "$out/snapshot.jpg"
echo; echo "== one object event (start, update or end of a tracked shape: docs/analytics.md)"
mosquitto_sub -p "$port" -t edge/demo-cam/events -C 1 -W 30
echo; echo "== a clip around an object's start on cam1, fetched over MQTT in chunks (edge-agent fleet media --clip)"
event=$(mosquitto_sub -p "$port" -t edge/demo-cam/events -W 60 | grep -m1 '"clip"' |
  .venv/bin/python -c 'import json, sys; print(json.loads(sys.stdin.readline())["object_id"])')
sleep 3  # the clip is on the device's disk post_s (2 s) after the object's start
.venv/bin/edge-agent fleet media demo-cam "$event" --clip --broker "$broker" -o "$out/clip.mp4"
echo; echo "== a simulated fleet: 10 devices of the real code on their own mosquitto, one group push, the broker's ceiling"
.venv/bin/python bench/fleet_sim.py --devices 10 --bundle-mb 2 --port "${EDGE_AGENT_DEMO_SIM_PORT:-0}"
echo; echo "== the status page: health, a few metrics, and edge-agent doctor (the page's checks from a shell)"
curl -s "$page/healthz"; echo
curl -s "$page/metrics" | grep -E '^edge_agent_(camera_fps|broker_connected|deployment_state\{.*SUCCEEDED)'
.venv/bin/edge-agent doctor --config "$out/agent.yaml" || true

cat <<TEXT

Where to look (the broker and the agent keep running; stop them with: scripts/demo.sh stop)
  annotated frames:   $out/scene.jpg (detect), $out/snapshot.jpg (the agent's camera)
  everything:         mosquitto_sub -p $port -t 'edge/#' -v
  telemetry:          mosquitto_sub -p $port -t edge/demo-cam/telemetry   (sensors, governor, energy_mj_per_frame)
  sensors, live:      .venv/bin/edge-agent telemetry --watch 2
  the fleet:          .venv/bin/edge-agent fleet status --broker $broker
  the status page:    $page/   (problems, live frames, charts; read only: no credentials set)
  the agent's log:    $out/agent.log      its config: $out/agent.yaml
TEXT

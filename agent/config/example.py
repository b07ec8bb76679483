"""``edge-agent config example``: a commented agent.yaml that ``edge-agent run`` accepts as is."""

from __future__ import annotations

import json
from pathlib import Path

from agent.config.recipes import recipe
from agent.paths import DEFAULT_STATE_DIR


def _quoted(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid YAML scalar, whatever it holds


def example_config(
    *,
    device_id: str = "cam-01",
    group: str | None = None,
    broker: str = "mqtt://localhost:1883",
    state_dir: Path = DEFAULT_STATE_DIR,
    source: str = "synthetic",
    trust_key: Path | None = None,
    operator_key: Path | None = None,
    status_listen: str | None = None,
    status_user: str | None = None,
    status_password_file: Path | None = None,
) -> str:
    """The YAML text; `trust_key` None writes ``allow_unsigned: true`` and `operator_key` None
    ``allow_unsigned_control: true``, each with a warning comment. `source` is a source string or
    the name of a board recipe (`agent.config.recipes`), written with what it is for.
    `status_listen` (HOST:PORT) serves the status page, with `status_user` and
    `status_password_file` when given (needed beyond loopback; the caller checks that)."""
    found = recipe(source)
    camera = f"  # {found.camera}, on {found.board}: needs {found.note} (docs/cameras.md)\n" if found else ""
    source = found.source if found else source
    loop = "" if found else "    loop: true\n"  # repeats a file; a board's camera is live
    if trust_key is not None:
        trust = f"trust_keys:\n  - {_quoted(str(trust_key))}\nallow_unsigned: false"
    else:
        trust = (
            "# No trusted key given: unsigned bundles are accepted. Add your signing.pub here\n"
            "# (edge-agent keygen) and set allow_unsigned: false before going to the field.\n"
            "trust_keys: []\nallow_unsigned: true"
        )
    if operator_key is not None:
        control = f"operator_keys:\n  - {_quoted(str(operator_key))}\nallow_unsigned_control: false"
    else:
        control = (
            "# No operator key given: unsigned desired documents and commands are obeyed, from anyone\n"
            "# who can publish to the broker. Add your operator.pub here (edge-agent keygen) and set\n"
            "# allow_unsigned_control: false before going to the field.\n"
            "operator_keys: []\nallow_unsigned_control: true"
        )
    page = _status_page(status_listen, status_user, status_password_file)
    group_line = (
        f"  group: {_quoted(group)}" if group else "  # group: lobby-cameras   # follow the group's deployments"
    )
    return f"""\
# edge-agent configuration (docs/configuration.md). Check it with: edge-agent config check FILE
device:
  id: {_quoted(device_id)}
{group_line}

state_dir: {_quoted(str(state_dir))}
{trust}
{control}
max_clock_skew_s: 300   # signed commands older (or newer) than this are refused: keep the clock synchronised
runtime: auto           # auto | tensorrt | onnxruntime | litert | openvino
# runtimes:             # settings per backend (docs/configuration.md)
#   onnxruntime: {{providers: [cuda, cpu], intra_op_threads: 0}}
#   litert: {{num_threads: 4}}
#   tensorrt: {{precision: fp16, workspace_mb: 1024}}   # engines cached in <state_dir>/engines
keep_versions: 3

mqtt:
  broker: {_quoted(broker)}
  topic_root: edge
  # username: device-cam-01
  # password: {{file: /etc/edge-agent/mqtt-password}}   # or {{env: EDGE_AGENT_MQTT_PASSWORD}}
  # tls:
  #   ca_file: /etc/edge-agent/ca.pem
  #   cert_file: /etc/edge-agent/device.pem   # mutual TLS
  #   key_file: /etc/edge-agent/device.key
  offline_queue: 1000

deployments:
  max_download_rate: 0  # bytes per second, 0 = unlimited
  window: 16
  autotune: true        # at activation, serve the fastest configuration within the bundle's parity tolerance
  # max_latency_ms: 120 # ... whose p95 latency per frame is within this
  # report: true        # publish the optimisation matrix on <device>/report after each activation
  download_timeout_s: 3600  # a deployment that cannot get its bundle in time ends FAILED (DOWNLOAD_TIMEOUT)
  probation_s: 120        # a new version is rolled back if its cameras fail or its FPS halves within this

cameras:
{camera}  - name: cam0
    source: {_quoted(source)}
{loop}    # conf: 0.5               # keep detections scoring above this (default: the bundle's, bundle build --conf)
    # classes: [person, car]  # keep only these labels of the bundle (default: all), before tracking and events
    max_fps: 15

telemetry:
  interval_s: 10

events:
  min_interval_s: 5
  min_confidence: 0.5

# serving:                # how the cameras are served (docs/cameras.md)
#   share_model: true     # one loaded model for all cameras
#   batch: true           # frames of several cameras in one batch (models with a dynamic batch axis)
#   ffmpeg: {{hwaccel: auto}}   # auto: the board's hardware H.264 decoder; none; or [-c:v, NAME]

{page}
"""


def _status_page(listen: str | None, user: str | None, password_file: Path | None) -> str:
    if listen is None:
        return (
            "# status_page:              # the technician's page, /metrics and /healthz (docs/status-page.md)\n"
            '#   listen: "127.0.0.1:8080"  # beyond loopback only with username and password_file\n'
            "#   username: technician\n"
            "#   password_file: /etc/edge-agent/page-password"
        )
    lines = ["status_page:  # the technician's page, /metrics and /healthz", f"  listen: {_quoted(listen)}"]
    if user is not None and password_file is not None:
        lines += [f"  username: {_quoted(user)}", f"  password_file: {_quoted(str(password_file))}"]
    return "\n".join(lines)

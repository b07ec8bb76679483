#!/usr/bin/env python3
"""The aarch64 smoke run (docs/arm64.md): edge-agent under qemu-aarch64-static on a Debian
arm64 root, its detections compared with this machine's on the same image.

    scripts/arm64_smoke.sh [--json]          # installs qemu-user-static and debootstrap, then runs this
    python scripts/arm64_smoke.py [--json] [--cache DIR]
    python scripts/arm64_smoke.py compare REFERENCE.json OTHER.json    # the detections check alone

Cached under ``$EDGE_AGENT_ARM64_CACHE`` (default ``~/.cache/edge-agent/arm64``), never in the
repository: ``root-<suite>/`` (``debootstrap --foreign --arch=arm64``, its packages' .debs then
unpacked by hand: nothing runs as a package script) and ``site-<hash>/`` (the aarch64 wheels of
the dependencies, as pip chooses them for the root's Python and glibc). The repository itself
is put on ``PYTHONPATH``, so the run tests this working tree. A wrapper ``python3-aarch64``
starts the root's Python under the emulator with its own path as ``argv[0]``, so the agent's
child processes (``sys.executable``) are emulated too although binfmt_misc is not mounted.

``--json`` prints ``{"arch", "python", "litert_version", "onnxruntime": "ok" | why not,
"detections_ok", "seconds", ...}``; ``detections_ok`` is true when every runtime that ran on
aarch64 found the same labels as on this machine, each box with IoU >= 0.9 to its counterpart.
Exit status 0 when ``detections_ok``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.decoding.detections import Detections
from pipelines.measure.evaluate import MatchCounts

REPO = Path(__file__).resolve().parent.parent

#: emulated cores: qemu's name -> the /proc/cpuinfo fields a real one shows. qemu-user 7.2 does
#: not emulate /proc/cpuinfo for aarch64 (it shows the host's x86 one, on which the cpuinfo
#: library inside ONNX Runtime and XNNPACK crashes with SIGSEGV), but it reads files through the
#: -L root first, so the root gets an aarch64 one for the chosen core.
CPUS = {
    "cortex-a76": {  # Raspberry Pi 5 (BCM2712)
        "Features": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
        "asimddp",
        "CPU implementer": "0x41",
        "CPU architecture": "8",
        "CPU variant": "0x4",
        "CPU part": "0xd0b",
        "CPU revision": "1",
    },
    "cortex-a72": {  # Raspberry Pi 4 (BCM2711): no crypto extensions, no dot product
        "Features": "fp asimd evtstrm crc32 cpuid",
        "CPU implementer": "0x41",
        "CPU architecture": "8",
        "CPU variant": "0x0",
        "CPU part": "0xd08",
        "CPU revision": "3",
    },
}
#: what the root's Python says of itself: its version and its C library's
FACTS = "import json, platform, sys; print(json.dumps([sys.version_info[:2], platform.libc_ver()]))"
DEMO = REPO / "agent" / "demo"
MODELS = {"litert": DEMO / "demo_detector_int8.tflite", "onnxruntime": DEMO / "demo_detector.onnx"}
MIN_IOU = 0.9
SUITE = os.environ.get("EDGE_AGENT_ARM64_SUITE", "bookworm")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- comparing detections ------------------------------------------------------------------------


def _detections(rows: list[dict[str, Any]], labels: list[str]) -> Detections:
    for row in rows:
        if row["label"] not in labels:
            labels.append(row["label"])
    return Detections(
        np.array([row["box"] for row in rows], np.float32).reshape(-1, 4),
        np.array([row["score"] for row in rows], np.float32),
        np.array([labels.index(row["label"]) for row in rows], np.int32),
    )


def compare(reference: list[dict[str, Any]], other: list[dict[str, Any]], min_iou: float = MIN_IOU) -> str | None:
    """None when `other` has the same labelled boxes as `reference` (one to one, same label,
    IoU >= `min_iou`); else what differs. An empty reference never agrees: it proves nothing."""
    if not reference:
        return "the reference found nothing to compare"
    labels: list[str] = []
    counts = MatchCounts()
    counts.add(_detections(other, labels), _detections(reference, labels), iou_threshold=min_iou)
    if counts.false_positives or counts.false_negatives:
        return (
            f"{counts.true_positives} of {len(reference)} reference boxes matched (same label, IoU >= {min_iou}); "
            f"{counts.false_positives} extra, {counts.false_negatives} missing"
        )
    return None


def _rows(path: Path) -> list[dict[str, Any]]:
    """The detections of `edge-agent detect --json` output (one image)."""
    return list(json.loads(path.read_text().splitlines()[0])["detections"])


# -- the aarch64 root and wheels -----------------------------------------------------------------


def _run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=True, text=True, **options)


def _as_root(command: list[str]) -> list[str]:
    return command if os.geteuid() == 0 else ["sudo", *command]


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (``EDGE_AGENT_ARM64_MIRROR`` overrides)."""
    if os.environ.get("EDGE_AGENT_ARM64_MIRROR"):
        return os.environ["EDGE_AGENT_ARM64_MIRROR"]
    texts = [p.read_text() for p in sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    uris = [u for text in texts for u in re.findall(r"^URIs:\s*(\S+)", text, re.MULTILINE)]
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.is_file():
        uris += re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", sources_list.read_text(), re.MULTILINE)
    for uri in uris:
        if uri.rstrip("/").endswith("/debian"):
            return uri
    sys.exit("no Debian mirror in /etc/apt/sources.list*; set EDGE_AGENT_ARM64_MIRROR to one")


def build_root(cache: Path) -> Path:
    """A Debian arm64 root with python3, made once: debootstrap's first stage, then every
    downloaded package unpacked with dpkg-deb (the second stage would need the emulator
    registered with binfmt_misc)."""
    root = cache / f"root-{SUITE}"
    if (root / ".edge-agent-complete").is_file():
        return root
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    staging = cache / f"root-{SUITE}.tmp"
    if staging.exists():
        _run(_as_root(["rm", "-rf", str(staging)]))
    mirror = debian_mirror()
    log(f"building the arm64 root ({SUITE} from {mirror}) in {root}")
    command = [debootstrap, "--foreign", "--arch=arm64", "--variant=minbase", "--include=python3", SUITE]
    _run(_as_root([*command, str(staging), mirror]), stdout=subprocess.DEVNULL)
    archives = staging / "var" / "cache" / "apt" / "archives"
    for deb in sorted(archives.glob("*.deb")):
        _run(_as_root(["dpkg-deb", "-x", str(deb), str(staging)]))
        _run(_as_root(["rm", "-f", str(deb)]))
    (staging / ".edge-agent-complete").write_text(mirror + "\n")
    staging.rename(root)
    return root


def write_wrapper(cache: Path, root: Path, cpu: str, host_cpuinfo: bool = False) -> Path:
    """``python3-aarch64-<cpu>``: the root's Python under qemu-aarch64-static emulating `cpu`,
    with ``argv[0]`` = the wrapper (so ``sys.executable`` starts emulated children); and the
    root's ``/proc/cpuinfo`` describing that core, one entry per CPU this machine has (removed
    with `host_cpuinfo`: the libraries then see this machine's x86 one, and crash)."""
    qemu = shutil.which("qemu-aarch64-static")
    if qemu is None:
        sys.exit("qemu-aarch64-static is not installed (apt-get install qemu-user-static)")
    python = next(iter(sorted((root / "usr" / "bin").glob("python3.[0-9]*"))), None)
    if python is None:
        sys.exit(f"no python3.X in {root}/usr/bin: remove {root} and run again")
    fields = "".join(f"{key}\t: {value}\n" for key, value in CPUS[cpu].items())
    entries = [f"processor\t: {n}\nBogoMIPS\t: 108.00\n{fields}" for n in range(os.cpu_count() or 1)]
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "cpuinfo").write_text("\n".join(entries))
    if host_cpuinfo:
        (root / "proc" / "cpuinfo").unlink()
    wrapper = cache / f"python3-aarch64-{cpu}"
    wrapper.write_text(f'#!/bin/sh\nexec {qemu} -L {root} -cpu {cpu} -0 "$0" {python} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def requirements(pins: list[str]) -> list[str]:
    """edge-agent's runtime requirements as installed here (no extras), then `pins` (e.g.
    ``ai-edge-litert==1.4.0``; pip takes both ranges of a name together)."""
    return [*(r for r in metadata.requires("edge-agent") or [] if "extra ==" not in r), *pins]


def install_wheels(cache: Path, python: tuple[int, int], glibc: tuple[int, int], pins: list[str]) -> Path:
    """The aarch64 wheels of the requirements in ``site-<hash>``, chosen by pip for the root's
    Python and glibc (every manylinux tag the root's glibc runs)."""
    platforms = [f"manylinux_{glibc[0]}_{minor}_aarch64" for minor in range(glibc[1], 16, -1)]
    platforms += ["manylinux2014_aarch64", "linux_aarch64"]
    wanted = requirements(pins)
    key = hashlib.sha256(json.dumps([wanted, python, platforms]).encode()).hexdigest()[:12]
    site = cache / f"site-{key}"
    if (site / ".edge-agent-complete").is_file():
        return site
    staging = cache / f"site-{key}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    log(f"downloading the aarch64 wheels for Python {python[0]}.{python[1]}, glibc {glibc[0]}.{glibc[1]}")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(staging), "--only-binary=:all:"]
    pip += ["--python-version", f"{python[0]}.{python[1]}", "--implementation", "cp"]
    pip += [flag for platform in platforms for flag in ("--platform", platform)]
    _run([*pip, *wanted], stdout=sys.stderr)
    (staging / ".edge-agent-complete").write_text("\n".join(wanted) + "\n")
    staging.rename(site)
    return site


# -- the run -------------------------------------------------------------------------------------


def _detect(python: list[str], env: dict[str, str], runtime: str, image: Path, out: Path) -> str | None:
    """``edge-agent detect`` of the runtime's demo model on `image` into `out`; None when it
    worked, else the last line it printed."""
    command = [*python, "-m", "agent.cli", "detect", str(MODELS[runtime]), str(image), "--runtime", runtime, "--json"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr.strip() or f"exit status {done.returncode}").splitlines()
        return f"detect failed ({done.returncode}): {lines[-1]}"
    out.write_text(done.stdout)
    return None


def smoke(cache: Path, cpu: str, pins: list[str], host_cpuinfo: bool) -> dict[str, Any]:
    started = time.monotonic()
    steps: dict[str, float] = {}

    def step(name: str, since: float) -> None:
        steps[name] = round(time.monotonic() - since, 1)

    cache.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    root = build_root(cache)
    wrapper = write_wrapper(cache, root, cpu, host_cpuinfo)
    step("root", t)
    t = time.monotonic()
    facts = subprocess.run(
        [
            str(wrapper),
            "-c",
            "import json, platform, sys; print(json.dumps([sys.version_info[:2], platform.libc_ver()]))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (major, minor), (_, libc) = json.loads(facts.stdout)
    glibc = tuple(int(v) for v in libc.split(".")[:2])
    site = install_wheels(cache, (major, minor), (glibc[0], glibc[1]), pins)
    step("wheels", t)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    host_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    work = Path(tempfile.mkdtemp(prefix="edge-agent-arm64-"))
    _run([sys.executable, str(REPO / "scripts" / "make_demo_media.py"), str(work), "--frames", "1"], stdout=sys.stderr)
    image = work / "scene.png"

    t = time.monotonic()
    log("edge-agent probe --json (aarch64)")
    probe = subprocess.run(
        [str(wrapper), "-m", "agent.cli", "probe", "--json"], cwd=REPO, env=env, capture_output=True, text=True
    )
    step("probe", t)
    if probe.returncode != 0:
        sys.exit(f"edge-agent probe failed on aarch64 ({probe.returncode}):\n{probe.stderr[-3000:]}")
    report = json.loads(probe.stdout)
    runtimes = report["runtimes"]
    results: dict[str, str | None] = {}
    for runtime in ("litert", "onnxruntime"):
        info = runtimes[runtime]
        if not info["available"]:
            results[runtime] = info["reason"]
            continue
        t = time.monotonic()
        log(f"edge-agent detect {MODELS[runtime].name} --runtime {runtime} (aarch64, then x86_64)")
        problem = _detect([str(wrapper)], env, runtime, image, work / f"{runtime}-aarch64.json")
        step(f"detect_{runtime}", t)
        problem = problem or _detect([sys.executable], host_env, runtime, image, work / f"{runtime}-host.json")
        if problem is None:
            problem = compare(_rows(work / f"{runtime}-host.json"), _rows(work / f"{runtime}-aarch64.json"))
        results[runtime] = problem
    ran = [runtime for runtime in results if runtimes[runtime]["available"]]
    detections_ok = "litert" in ran and all(results[runtime] is None for runtime in ran)
    if detections_ok:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "arch": report["board"]["arch"],
        "cpu": cpu + (" (host /proc/cpuinfo)" if host_cpuinfo else ""),
        "python": f"{major}.{minor}",
        "glibc": libc,
        "litert_version": runtimes["litert"]["version"],
        "onnxruntime_version": runtimes["onnxruntime"]["version"],
        "onnxruntime": results["onnxruntime"] or "ok",
        "litert": results["litert"] or "ok",
        "detections_ok": detections_ok,
        "seconds": round(time.monotonic() - started, 1),
        "steps_s": steps,
        **({} if detections_ok else {"kept": str(work)}),
    }


def main() -> int:
    if sys.argv[1:2] == ["compare"]:
        reference, other = (Path(p) for p in sys.argv[2:4])
        problem = compare(_rows(reference), _rows(other))
        print(problem or "same detections")
        return 1 if problem else 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    default_cache = Path(os.environ.get("EDGE_AGENT_ARM64_CACHE", Path.home() / ".cache" / "edge-agent" / "arm64"))
    parser.add_argument("--cache", type=Path, default=default_cache, help=f"default {default_cache}")
    parser.add_argument(
        "--cpu", choices=sorted(CPUS), default="cortex-a76", help="the core to emulate (default a Pi 5's)"
    )
    parser.add_argument(
        "--pin", action="append", default=[], metavar="REQ", help="also require REQ, e.g. ai-edge-litert==1.4.0"
    )
    parser.add_argument(
        "--host-cpuinfo", action="store_true", help="leave /proc/cpuinfo to qemu (this machine's: the libraries crash)"
    )
    args = parser.parse_args()
    result = smoke(args.cache, args.cpu, args.pin, args.host_cpuinfo)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"aarch64 ({result['cpu']}), Python {result['python']}, glibc {result['glibc']}: {result['seconds']} s")
        print(f"  steps (s): {result['steps_s']}")
        print(f"  litert {result['litert_version']}: {result['litert']}")
        print(f"  onnxruntime {result['onnxruntime_version']}: {result['onnxruntime']}")
        print(f"  detections_ok: {result['detections_ok']}")
    return 0 if result["detections_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Boot a fresh Debian 12 VM, install edge-agent in it as README says, and check the service.

`scripts/vm_test.sh` runs this with the host's python3 (standard library only: it runs before any
venv exists). docs/service.md ("What was seen on a booted system") lists the checks and the figures.

    scripts/vm_test.sh [--arch amd64|arm64] [--json] [--keep]      # build (cached), boot, check
    scripts/vm_test.sh [--arch ARCH] exec CMD...                   # in the VM left by --keep, as root
    scripts/vm_test.sh [--arch ARCH] stop                          # shut that VM down

The image (debootstrap, Debian's linux-image kernel, systemd as PID 1) is built once into
``$EDGE_AGENT_VM_CACHE`` (default ``~/.cache/edge-agent-vm``)/ARCH and every run boots a fresh
copy-on-write overlay of it, so each run installs on a system nobody has touched. The VM reaches
Debian's mirrors and PyPI through qemu's user network, as the host does (install.sh installs what
it needs, the way a technician's device does). All test traffic goes through one SSH port forward
bound to the host's 127.0.0.1: the broker (mosquitto, inside the VM) and the status page are
reached through ``ssh -L`` tunnels to the VM's own 127.0.0.1.

Threads: one; the qemu process and the SSH tunnels are child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
MIRROR = os.environ.get("EDGE_AGENT_VM_MIRROR", "http://deb.debian.org/debian")
#: what the image has besides debootstrap's minbase: a kernel, systemd as init, SSH for the
#: driver, mosquitto as the fleet's broker. No python3: install.sh must install it itself.
PACKAGES = (
    "systemd-sysv,udev,kmod,dbus,iproute2,openssh-server,ca-certificates,mosquitto,procps,initramfs-tools,{kernel}"
)
IMAGE_VERSION = "1"  # bump to rebuild every cached image


@dataclass(frozen=True)
class Arch:
    """How one architecture's VM is built and booted."""

    name: str  # Debian's: amd64 or arm64
    kernel: str  # the linux-image package
    qemu: str
    console: str  # the kernel's serial console


ARCHES = {
    "amd64": Arch("amd64", "linux-image-amd64", "qemu-system-x86_64", "ttyS0"),
    "arm64": Arch("arm64", "linux-image-arm64", "qemu-system-aarch64", "ttyAMA0"),
}


def log(message: str) -> None:
    """Progress on stderr (stdout carries the JSON)."""
    print(f"vm_test: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("EDGE_AGENT_VM_CACHE", Path.home() / ".cache" / "edge-agent-vm"))


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`cmd`, checked; what it prints goes to stderr unless captured, so `--json`'s stdout is JSON
    only (mkfs.ext4 -q still prints "Creating regular file ...")."""
    if "stdout" not in kwargs and not kwargs.get("capture_output"):
        kwargs["stdout"] = sys.stderr
    return subprocess.run(cmd, check=True, text=True, **kwargs)


# ---------------------------------------------------------------------------------------------
# the image
# ---------------------------------------------------------------------------------------------


#: qemu-user's name for each architecture (its binfmt_misc entry: /proc/sys/fs/binfmt_misc/qemu-NAME)
QEMU_USER = {"amd64": "x86_64", "arm64": "aarch64"}


def image_dir(arch: Arch) -> Path:
    key = hashlib.sha256(f"{IMAGE_VERSION} {PACKAGES} {arch.kernel} {MIRROR}".encode()).hexdigest()[:12]
    return cache_root() / f"{arch.name}-{key}"


def build_image(arch: Arch) -> Path:
    """The cached base image's folder (base.qcow2, vmlinuz, initrd.img, id_ed25519); built once."""
    out = image_dir(arch)
    if (out / "done").exists():
        log(f"image cached in {out}")
        return out
    for tool in ("debootstrap", "mkfs.ext4", "qemu-img"):
        if shutil.which(tool) is None:
            raise SystemExit(f"vm_test: {tool} is missing (apt-get install debootstrap qemu-utils e2fsprogs)")
    foreign = arch.name != host_arch()
    if foreign and not Path(f"/proc/sys/fs/binfmt_misc/qemu-{QEMU_USER[arch.name]}").exists():
        raise SystemExit(
            f"vm_test: building the {arch.name} image runs its binaries through qemu-user, which is not "
            "registered with binfmt_misc here (apt-get install qemu-user-static binfmt-support)"
        )
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    root = out / "root"
    started = time.monotonic()
    log(f"building the Debian 12 {arch.name} image in {out} (debootstrap, a few minutes)")
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--arch={arch.name}",
        f"--include={PACKAGES.format(kernel=arch.kernel)}",
    ]
    if foreign:
        cmd.append("--foreign")
    run([*cmd, "bookworm", str(root), MIRROR], stdout=subprocess.DEVNULL)
    if foreign:
        # the second stage runs the arm64 binaries through qemu-user's binfmt handler
        run(["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"], stdout=subprocess.DEVNULL)
    key = out / "id_ed25519"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    shutil.copy(f"{key}.pub", root / "root/.ssh/authorized_keys")
    (root / "etc/hostname").write_text("edge-vm\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 edge-vm\n")
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("nameserver 10.0.2.3\n")  # qemu's user network DNS
    (root / "etc/systemd/network/20-wired.network").write_text("[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n")
    (root / "etc/apt/sources.list").write_text(
        f"deb {MIRROR} bookworm main\ndeb {MIRROR} bookworm-updates main\n"
        "deb http://deb.debian.org/debian-security bookworm-security main\n"
    )
    run(["chroot", str(root), "systemctl", "enable", "systemd-networkd", "ssh"], stdout=subprocess.DEVNULL)
    run(["chroot", str(root), "passwd", "-d", "root"], stdout=subprocess.DEVNULL)
    boot = root / "boot"
    shutil.copy(next(boot.glob("vmlinuz-*")), out / "vmlinuz")
    shutil.copy(next(boot.glob("initrd.img-*")), out / "initrd.img")
    raw = out / "base.raw"
    run(["mkfs.ext4", "-q", "-L", "root", "-d", str(root), str(raw), "6G"])
    run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(out / "base.qcow2")])
    raw.unlink()
    shutil.rmtree(root)
    (out / "done").write_text(f"{time.monotonic() - started:.0f}\n")
    log(f"image built in {time.monotonic() - started:.0f} s")
    return out


def host_arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


# ---------------------------------------------------------------------------------------------
# the VM
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kvm_usable() -> bool:
    """/dev/kvm exists and this user may open it (whether a guest then boots is probed apart)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


@dataclass
class Vm:
    """A booted VM: its qemu process, its SSH port on the host's 127.0.0.1 and its key."""

    arch: Arch
    image: Path
    work: Path  # this run's folder: overlay.qcow2, console.log, vm.json
    accel: str = "tcg"
    ssh_port: int = 0
    qemu_pid: int = 0
    tunnels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    probe: str = "not tried"  # what the KVM probe saw

    # --- life ---
    def qemu_command(self) -> list[str]:
        a = self.arch
        cmd = [a.qemu, "-m", "3072", "-smp", "2", "-nodefaults"]
        if a.name == "amd64":
            cmd += ["-machine", "q35", "-accel", self.accel]
            cmd += ["-cpu", "host" if self.accel == "kvm" else "max"]
        else:
            # a Raspberry Pi 5's core (a Jetson Orin's A78AE is the same ARMv8.2 generation); `max`
            # adds SVE and pointer authentication, which emulate slowly and no such board has
            cmd += ["-machine", "virt", "-cpu", "cortex-a76", "-accel", "tcg,thread=multi"]
        cmd += [
            "-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
            "-append", f"root=/dev/vda rw console={a.console} panic=-1 net.ifnames=0",
            "-drive", f"file={self.work / 'overlay.qcow2'},if=virtio,format=qcow2",
            "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22",
            "-device", "virtio-net-pci,netdev=net0",
            "-device", "virtio-rng-pci",
            "-serial", f"file:{self.work / 'console.log'}",
            "-monitor", "none", "-display", "none", "-daemonize", "-pidfile", str(self.work / "qemu.pid"),
        ]  # fmt: skip
        return cmd

    def start(self) -> None:
        """Start qemu (daemonised) on a fresh overlay of the base image."""
        overlay = self.work / "overlay.qcow2"
        overlay.unlink(missing_ok=True)
        run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "qcow2",
                "-b",
                str(self.image / "base.qcow2"),
                str(overlay),
            ]
        )
        self.ssh_port = free_port()
        run(["nice", "-n", "10", *self.qemu_command()])
        self.qemu_pid = int((self.work / "qemu.pid").read_text())
        self.save()

    def boot(self, timeout: float) -> bool:
        """Start qemu and wait for SSH; False if it did not come up in time."""
        self.start()
        return self.wait_ssh(timeout)

    def wait_ssh(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return False
            if self.sh("true", check=False, timeout=20).returncode == 0:
                return True
            time.sleep(2)
        return False

    def alive(self) -> bool:
        try:
            os.kill(self.qemu_pid, 0)
        except OSError:
            return False
        return True

    def kill(self) -> None:
        for t in self.tunnels:
            t.terminate()
        if self.qemu_pid and self.alive():
            os.kill(self.qemu_pid, signal.SIGTERM)
            for _ in range(50):
                if not self.alive():
                    break
                time.sleep(0.2)
        (self.work / "vm.json").unlink(missing_ok=True)

    def save(self) -> None:
        (self.work / "vm.json").write_text(
            json.dumps(
                {"accel": self.accel, "ssh_port": self.ssh_port, "qemu_pid": self.qemu_pid, "image": str(self.image)}
            )
        )

    @classmethod
    def load(cls, arch: Arch) -> Vm:
        work = cache_root() / f"{arch.name}-run"
        try:
            saved = json.loads((work / "vm.json").read_text())
        except FileNotFoundError:
            raise SystemExit(f"vm_test: no {arch.name} VM is running (start one with --keep)") from None
        return cls(arch, Path(saved["image"]), work, saved["accel"], saved["ssh_port"], saved["qemu_pid"])

    # --- commands ---
    def ssh_base(self) -> list[str]:
        return [
            "ssh", "-q", "-i", str(self.image / "id_ed25519"), "-p", str(self.ssh_port),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6", "-o", "BatchMode=yes",
        ]  # fmt: skip

    def sh(
        self, script: str, check: bool = True, timeout: float = 600, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` with bash as root in the VM; stdout and stderr captured."""
        try:
            done = subprocess.run(
                [*self.ssh_base(), "root@127.0.0.1", "bash", "-c", shlex.quote(script)],
                input=stdin.decode() if stdin is not None else None,
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            done = subprocess.CompletedProcess(e.cmd, 124, str(e.stdout or ""), f"timed out after {timeout} s")
        if check and done.returncode != 0:
            raise CheckError(f"`{script[:200]}` exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def put_tar(self, data: bytes, dest: str) -> None:
        done = subprocess.run(
            [*self.ssh_base(), "root@127.0.0.1", f"mkdir -p {dest} && tar -xzf - -C {dest}"],
            input=data,
            capture_output=True,
        )
        if done.returncode != 0:
            raise CheckError(f"copying into {dest} failed: {done.stderr.decode()[-500:]}")

    def tunnel(self, remote_port: int) -> int:
        """`ssh -L` from the host's 127.0.0.1 to the VM's 127.0.0.1:remote_port; the host port."""
        port = free_port()
        proc = subprocess.Popen(
            [
                *self.ssh_base(),
                "-N",
                "-o",
                "ExitOnForwardFailure=yes",
                "-L",
                f"127.0.0.1:{port}:127.0.0.1:{remote_port}",
                "root@127.0.0.1",
            ]
        )
        self.tunnels.append(proc)
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port
            time.sleep(0.2)
        raise CheckError(f"the SSH tunnel to the VM's port {remote_port} did not open")


def kvm_probe(vm: Vm, timeout: float) -> str:
    """Start `vm` under KVM: "booted" once the kernel prints its first line, else what went wrong.

    On these hosts /dev/kvm opens and a vCPU is created, but the host is itself a Firecracker
    guest whose nested KVM (PVM) runs only kernels built as PVM guests: qemu aborts setting MSR
    0x10a with ``-cpu host`` and, with the MSR left out, Debian's kernel never prints a line.
    """
    try:
        vm.start()
    except subprocess.CalledProcessError as e:
        return f"qemu -accel kvm failed to start (exit {e.returncode})"
    deadline = time.monotonic() + timeout
    console = vm.work / "console.log"
    while time.monotonic() < deadline:
        if not vm.alive():
            return "qemu -accel kvm exited before the kernel printed anything"
        if b"Linux version" in console.read_bytes() if console.exists() else False:
            return "booted"
        time.sleep(0.5)
    shutil.copy(console, vm.work / "console-kvm.log")
    vm.kill()
    return f"the kernel printed nothing on the serial console within {timeout:.0f} s under KVM"


class CheckError(Exception):
    """A check failed; the message says what was seen."""


def start_vm(arch: Arch, image: Path, kvm_probe_s: float) -> Vm:
    """Boot the VM: under KVM when it is usable and a guest boots within `kvm_probe_s`, else TCG."""
    work = cache_root() / f"{arch.name}-run"
    if work.joinpath("vm.json").exists():
        with contextlib.suppress(SystemExit):
            Vm.load(arch).kill()
    work.mkdir(parents=True, exist_ok=True)
    if arch.name == host_arch() == "amd64" and kvm_usable() and os.environ.get("EDGE_AGENT_VM_ACCEL") != "tcg":
        vm = Vm(arch, image, work, "kvm")
        log(f"booting under KVM (probe: the kernel's first line on the console within {kvm_probe_s:.0f} s)")
        vm.probe = kvm_probe(vm, kvm_probe_s)
        if vm.probe == "booted" and vm.wait_ssh(300):
            return vm
        log(f"KVM: {vm.probe} (console: {work / 'console-kvm.log'}): falling back to TCG")
        vm.kill()
    probe = vm.probe if arch.name == "amd64" and "vm" in locals() else "not tried"
    vm = Vm(arch, image, work, "tcg")
    vm.probe = probe
    log("booting under TCG (emulated: slow)")
    if not vm.boot(900 if arch.name == "amd64" else 1800):
        vm.kill()
        raise SystemExit(f"vm_test: the VM did not boot (console: {work / 'console.log'})")
    return vm


# ---------------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------------

DEVICE = "vm-1"
UNIT = "edge-agent.service"
WATCHDOG_S, RESTART_S = 90.0, 5.0  # systemd/edge-agent.service
EXPOSURE_MAX = 2.0
VENV = "/opt/edge-agent/venv/bin"
STATE_DIR = "/var/lib/edge-agent"
#: where the checks put the update's wheels in the VM (readable by the service's user)
WHEELS = "/var/tmp/edge-agent-wheels"
#: agent/deployment/agent_switch.py's MAX_STARTS and CONFIRM_WITHIN_S (docs/fleet.md#agent-updates)
MAX_STARTS, CONFIRM_WITHIN_S = 3, 120.0
#: a version that crashes at start is rolled back after `MAX_STARTS` starts, "about 20 s under the
#: unit as shipped" (docs/fleet.md): each start `RESTART_S` after the last, and under TCG the
#: launcher's own Python start takes up to this long (on a board: a few seconds; on the loaded
#: 2-core development machine about 50 s). Counted from the switch, not from the upgrade's pip.
START_S_TCG = 60.0
ROLLBACK_S = MAX_STARTS * (RESTART_S + START_S_TCG)
#: how long `fleet push --agent --wait` waits for the device's deployment to end: the download,
#: the in-VM pip install of the new environment (about a minute under TCG), then the switch and
#: its confirmation (`CONFIRM_WITHIN_S`) or its rollback (`ROLLBACK_S`)
AGENT_PUSH_WAIT_S = 900.0
#: how long a just started agent may take to serve its page once it is online on the broker
PAGE_S = 180.0
#: the VM's broker with mosquitto's dynamic security plugin (`enrol_claim`), and its operator user
DYNSEC_JSON = "/var/lib/mosquitto/dynamic-security.json"
OPERATOR = "operator"


def exposure_of(report: str) -> float:
    """The figure of `systemd-analyze security UNIT`'s "Overall exposure level for X: 1.6 OK" line."""
    lines = [ln for ln in report.splitlines() if "Overall exposure level for" in ln]
    if not lines:
        raise ValueError(f"no overall exposure level in systemd-analyze's report: {report[-300:]!r}")
    # "...: 1.6 OK :-)" without a UTF-8 locale: the figure follows the unit name's colon
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", lines[-1])
    if match is None:
        raise ValueError(f"no figure in systemd-analyze's line {lines[-1]!r}")
    return float(match.group(1))


def tracebacks(journal: str) -> list[str]:
    """The tracebacks in a journal's text, each from its first line to the exception's line."""
    found, lines = [], journal.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith((" ", "\t"))), len(lines) - 1)
            found.append("\n".join(lines[i : end + 1]))
    return found


#: the exception the broken agent of `agent_rollback` raises at import; `journal_clean` leaves its
#: tracebacks out, since the check planted them
PLANTED_FAILURE = "this edge-agent is broken (planted by vm_test's agent_rollback)"


def unplanted(found: list[str]) -> list[str]:
    """`found` (tracebacks) without those that end in `PLANTED_FAILURE`."""
    return [t for t in found if not t.splitlines()[-1].endswith(PLANTED_FAILURE)]


def agent_version_in(init: str) -> str:
    """``__version__`` of agent/__init__.py's text."""
    match = re.search(r'^__version__ = "([^"]+)"$', init, re.MULTILINE)
    if match is None:
        raise ValueError("agent/__init__.py sets no __version__")
    return match.group(1)


def bump_patch(version: str) -> str:
    """SemVer's next patch release: 0.2.0 -> 0.2.1 (a pre-release or build suffix is dropped)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a SemVer version: {version!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return f"{major}.{minor}.{patch + 1}"


def agent_wheel(out: Path, version: str, broken: bool = False) -> Path:
    """This checkout's edge-agent as a wheel of `version` in `out` (built with the host's venv, as
    tests/e2e/test_agent_update.py builds its A+1 and A+2); `broken`: its package raises
    `PLANTED_FAILURE` at import."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp)
        for name in ("agent", "pipelines", "runtimes"):
            shutil.copytree(HERE / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(HERE / name, source / name)
        init = source / "agent/__init__.py"
        text = init.read_text()
        text = text.replace(f'__version__ = "{agent_version_in(text)}"', f'__version__ = "{version}"')
        init.write_text(text + (f"\nraise RuntimeError({PLANTED_FAILURE!r})\n" if broken else ""))
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"edge_agent-{version}-*.whl"):
            old.unlink()
        python = str(Path(host_cli()[0]).with_name("python"))
        pip = [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run([*pip, str(source)], env=env)
    (wheel,) = out.glob(f"edge_agent-{version}-*.whl")
    return wheel


def pushed_deployment(said: str) -> str:
    """The deployment's id in what ``fleet push`` printed ("pushed edge-agent 0.2.1 (...) to
    device:vm-1 as deployment ID")."""
    match = re.search(r"^pushed .* as deployment (\S+)$", said, re.MULTILINE)
    if match is None:
        raise ValueError(f"fleet push named no deployment: {said[-500:]!r}")
    return match.group(1)


def agent_deployment_problems(
    record: dict[str, Any] | None, deployment: str, version: str, state: str, code: str | None = None
) -> list[str]:
    """What differs between `record` (the device's deployment document, as ``fleet status
    --json`` reads it) and the agent deployment `deployment` of edge-agent `version` ended in
    `state` with the error `code` (None: no error); empty when nothing does. The document is
    retained, so the previous deployment's record is there until the device publishes this one."""
    if not record:
        return ["the device published no deployment record"]
    error = record.get("error") or {}
    seen = {"id": record.get("id"), "kind": record.get("kind"), "version": record.get("version"),
            "state": record.get("state"), "error code": error.get("code")}  # fmt: skip
    wanted = {"id": deployment, "kind": "agent", "version": version, "state": state, "error code": code}
    return [f"{k} {seen[k]!r}, not {v!r}" for k, v in wanted.items() if seen[k] != v]


def push_figures(pushed: dict[str, Any], end: str) -> dict[str, float | None]:
    """An agent push's seconds (`Checks.push_agent`) as a check reports them: from the push to the
    switch, from the switch to its `end` (confirmed, rolled_back: what the launcher and the new
    version decide, the limits' measure) and from the switch to the device's report of the
    deployment's end (the CLI's return); None where a moment was not seen."""
    switched, ended, reported = (pushed[k] for k in ("push_to_switch_s", "push_to_switch_end_s", "push_to_end_s"))

    def since_switch(t: float | None) -> float | None:
        return None if switched is None or t is None else round(t - switched, 1)

    return {
        "push_to_switch_s": None if switched is None else round(switched, 1),
        f"switch_to_{end}_s": since_switch(ended),
        "switch_to_reported_s": since_switch(reported),
    }


def installed_wheel(direct_url: str) -> str | None:
    """The wheel's file name when a distribution's direct_url.json (PEP 610, written by pip) says
    it was installed from a wheel file; None for anything else (a checkout's folder, an index)."""
    try:
        origin = json.loads(direct_url)
    except ValueError:
        return None
    if not isinstance(origin, dict) or "archive_info" not in origin:
        return None
    url = str(origin.get("url", ""))
    name = url.rsplit("/", 1)[-1]
    return name if url.startswith("file://") and name.endswith(".whl") else None


def checkout_tar() -> bytes:
    """The checkout as a gzipped tar: git's tracked and untracked-but-not-ignored files."""
    try:
        names = run(["git", "-C", str(HERE), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True).stdout
        files = [n for n in names.split("\0") if n and (HERE / n).is_file()]
    except (subprocess.CalledProcessError, FileNotFoundError):
        skip = {".venv", "build", ".git", "__pycache__", ".mypy_cache", ".ruff_cache"}
        files = [str(p.relative_to(HERE)) for p in HERE.rglob("*") if p.is_file() and not skip & set(p.parts)]
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            for name in files:
                tar.add(HERE / name, arcname=name)
        f.seek(0)
        return f.read()


def host_cli() -> list[str]:
    """The operator's edge-agent on the host: this checkout's venv, else the one on PATH."""
    venv = HERE / ".venv/bin/edge-agent"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("edge-agent")
    if found is None:
        raise SystemExit("vm_test: the operator's edge-agent CLI is missing on the host (scripts/setup.sh dev)")
    return [found]


def host_network_trust(vm: Vm) -> None:
    """Let the VM reach the registries as the host does: the host's local CA certificates.

    Where the host's HTTPS goes through a proxy with its own CA (in /usr/local/share/ca-certificates),
    the VM's apt and pip need it too; pip is told to use the system's bundle, as the host's pip is.
    """
    local = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if not local:
        return
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            for cert in local:
                tar.add(cert, arcname=cert.name)
        f.seek(0)
        vm.put_tar(f.read(), "/usr/local/share/ca-certificates")
    vm.sh(
        "update-ca-certificates >/dev/null && "
        "printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > /etc/pip.conf"
    )


@dataclass(frozen=True)
class AgentPush:
    """An agent bundle `Checks.push_next_agent` pushed, and what came of it."""

    before: str  # the version that ran before the push
    version: str  # the one pushed
    pid: int  # the unit's MainPID before the push
    restarts: int  # and its NRestarts
    pushed: dict[str, Any]  # `Checks.push_agent`'s
    reports: dict[str, Any]  # the device's records as `fleet status --json` reads them after the push
    problems: list[str]  # `agent_deployment_problems` of its deployment record
    record: dict[str, Any]  # `Checks.switch_record` after the push


class Checks:
    """The named checks, run in order on one booted VM; `results` is the JSON's ``checks``."""

    def __init__(self, vm: Vm) -> None:
        self.vm = vm
        self.results: dict[str, dict[str, Any]] = {}
        self.keys = vm.work / "keys"
        self.page_port = 0
        self.broker_port = 0
        self.broker_auth: list[str] = []  # the operator's --username/--password-file once the broker needs them
        self.wheel = ""  # this checkout's wheel in the VM, once `install` put it there

    def check(self, name: str, body: Callable[[], dict[str, Any]]) -> None:
        started = time.monotonic()
        log(f"check {name} ...")
        try:
            result = {"ok": True, **body()}
        except (CheckError, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
            result = {"ok": False, "error": str(e)[-3000:]}
        result["took_s"] = round(time.monotonic() - started, 1)
        log(f"check {name}: {'ok' if result['ok'] else 'FAILED'} {json.dumps(result)[:400]}")
        self.results[name] = result

    # --- helpers ---
    def show(self, *props: str) -> dict[str, str]:
        out = self.vm.sh(f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def now(self) -> float:
        return float(self.vm.sh("date +%s.%N").stdout)

    def journal(self, since: float) -> str:
        return self.vm.sh(f"journalctl -u {UNIT} --no-pager -o short-unix --since @{since:.3f}").stdout

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.page_port}{path}", timeout=20) as r:
            body = r.read()
            return json.loads(body) if r.headers.get_content_type() == "application/json" else body

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
        """Poll `predicate` (a VM or page read, not a timer) until it returns a truthy value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except (CheckError, subprocess.TimeoutExpired, OSError, ValueError, KeyError, TypeError) as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(every)
        raise CheckError(f"{what}: not seen within {timeout:.0f} s (last: {str(last)[:500]})")

    def restarts(self) -> int:
        return int(self.show("NRestarts")["NRestarts"])

    def main_pid(self) -> int:
        return int(self.show("MainPID")["MainPID"])

    def active_version(self) -> dict[str, Any]:
        out = self.vm.sh(
            "runuser -u edge-agent -- /opt/edge-agent/venv/bin/edge-agent status --state-dir /var/lib/edge-agent --json"
        ).stdout
        return json.loads(out)  # type: ignore[no-any-return]

    def cli(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run([*host_cli(), *args], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise CheckError(
                f"edge-agent {' '.join(args)} exited {done.returncode}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        return done.stdout + done.stderr

    def cli_json(self, *args: str) -> Any:
        """The host CLI's JSON answer (its stdout only), with the broker and its operator's login."""
        done = subprocess.run([*host_cli(), *args, *self.broker_args()], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise CheckError(f"edge-agent {' '.join(args)} exited {done.returncode}: {done.stderr[-1500:]}")
        return json.loads(done.stdout)

    def broker_args(self) -> list[str]:
        return ["--broker", f"mqtt://127.0.0.1:{self.broker_port}", *self.broker_auth]

    def page_status(self) -> dict[str, Any]:
        """The page's /api/status, once the page answers. An agent just started (here: the one
        enrolment started) is online on the broker before its page is served: `Agent.start`
        starts the page last, after uvicorn's import (seconds under TCG). Until then the VM's
        port refuses the tunnel's channel and ssh drops the connection it accepted with the
        request unread: "Connection reset by peer". Bounded by `PAGE_S`."""
        return self.wait("the page's /api/status", lambda: self.api("/api/status"), PAGE_S, 1.0)  # type: ignore[no-any-return]

    def page_agent_version(self) -> str:
        """The running agent's version, as its page says (waiting for the page to answer)."""
        return self.wait(  # type: ignore[no-any-return]
            "the page's agent_version", lambda: self.api("/api/status").get("agent_version"), PAGE_S
        )

    def switch_record(self) -> dict[str, Any]:
        """agents/switch.json (docs/fleet.md#agent-updates) and the version `agents/current` names."""
        out = self.vm.sh(f"cat {STATE_DIR}/agents/switch.json; echo; readlink {STATE_DIR}/agents/current || true")
        record, _, current = out.stdout.partition("\n")
        return {**json.loads(record), "current": current.strip() or None}

    def put_wheel(self, wheel: Path) -> str:
        """`wheel` copied into the VM's `WHEELS` (readable by the service's user); its path there."""
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w:gz") as tar:
                tar.add(wheel, arcname=wheel.name)
            f.seek(0)
            self.vm.put_tar(f.read(), WHEELS)
        self.vm.sh(f"chmod 0755 {WHEELS} && chmod 0644 {WHEELS}/{wheel.name}")
        return f"{WHEELS}/{wheel.name}"

    def switch_seen(self) -> tuple[str, str] | None:
        """The version and state agents/switch.json says; None before any switch (or while SSH is down)."""
        done = self.vm.sh(f"cat {STATE_DIR}/agents/switch.json", check=False, timeout=30)
        try:
            record = json.loads(done.stdout) if done.returncode == 0 else None
            return None if record is None else (str(record["version"]), str(record["state"]))
        except (ValueError, KeyError, TypeError):
            return None

    def push_agent(self, wheel: Path, version: str) -> dict[str, Any]:
        """The operator's way (docs/fleet.md, "From the fleet: agent bundles"): `wheel` (edge-agent
        `version`) built into an agent bundle signed with the host's signing key (the one the
        model bundles are signed with, in the device's `trust_keys`), then `fleet push --agent
        --target device:DEVICE --wait` with the operator's key. While the CLI waits, the VM's
        switch record is polled for the moments the device switches to `version` and the switch
        ends (confirmed or rolled back). What the CLI said, its exit status, the deployment's id,
        and the seconds from the push to the switch and to its end (None: not seen) and to the
        CLI's end."""
        bundle = wheel.with_name(f"edge-agent-{version}.bundle")
        self.cli("bundle", "build", "--agent", "--wheel", str(wheel),
                 "--key", str(self.keys / "signing/signing.key"), "-o", str(bundle))  # fmt: skip
        command = [*host_cli(), "fleet", "push", "--agent", str(bundle), "--target", f"device:{DEVICE}",
                   "--key", str(self.keys / "operator/signing.key"), "--wait", f"{AGENT_PUSH_WAIT_S:.0f}",
                   *self.broker_args()]  # fmt: skip
        t0 = time.monotonic()
        switched: float | None = None
        ended: float | None = None
        with tempfile.TemporaryFile("w+") as out:
            cli = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                while cli.poll() is None and time.monotonic() < t0 + AGENT_PUSH_WAIT_S + 120:
                    seen = self.switch_seen() if ended is None else None
                    if seen is not None and seen[0] == version:
                        switched = switched if switched is not None else time.monotonic() - t0
                        ended = time.monotonic() - t0 if seen[1] != "pending" else None
                    time.sleep(1)
                rc = cli.wait(60)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait()
            out.seek(0)
            said = out.read()
        return {"said": said, "rc": rc, "deployment": pushed_deployment(said), "push_to_switch_s": switched,
                "push_to_switch_end_s": ended, "push_to_end_s": time.monotonic() - t0,
                "bundle_bytes": bundle.stat().st_size}  # fmt: skip

    def deployment_record(self) -> dict[str, Any]:
        """The device's deployment record and its status as the operator reads them (`fleet status --json`)."""
        return self.cli_json("fleet", "status", "--json").get(DEVICE, {})  # type: ignore[no-any-return]

    def write_config(self, extra: str = "") -> None:
        """agent.yaml as a technician finishes it: the example install.sh wrote, keys added."""
        conf = self.vm.sh("cat /etc/edge-agent/agent.yaml.installed").stdout
        conf = conf.replace("trust_keys: []", "trust_keys: [/etc/edge-agent/signing.pub]")
        conf = conf.replace("allow_unsigned: true", "allow_unsigned: false")
        conf = conf.replace("operator_keys: []", "operator_keys: [/etc/edge-agent/operator.pub]")
        conf = conf.replace("allow_unsigned_control: true", "allow_unsigned_control: false")
        conf = conf.replace("probation_s: 120", "probation_s: 30")
        self.vm.sh(
            "cat > /etc/edge-agent/agent.yaml.new && chgrp edge-agent /etc/edge-agent/agent.yaml.new && "
            "chmod 0640 /etc/edge-agent/agent.yaml.new && mv /etc/edge-agent/agent.yaml.new /etc/edge-agent/agent.yaml",
            stdin=(conf + extra).encode(),
        )

    # --- the checks ---
    def install(self) -> dict[str, Any]:
        """This checkout's wheel built on the host (`agent_wheel`, its own version), then
        `scripts/install.sh --from WHEEL` as root in the VM; the checkout goes in too, for
        install.sh itself, the unit file, and the demo models and scripts later checks use."""
        vm = self.vm
        vm.put_tar(checkout_tar(), "/root/edge-agent")
        host_network_trust(vm)
        version = agent_version_in((HERE / "agent/__init__.py").read_text())
        wheel = self.wheel = self.put_wheel(agent_wheel(self.vm.work / "wheels", version))
        # the camera: the kernel's vivid test driver, loaded at every boot like a USB camera's module
        vm.sh("echo vivid > /etc/modules-load.d/vivid.conf && modprobe vivid && udevadm settle && test -c /dev/video0")
        t0 = self.now()
        out = vm.sh(
            f"cd /root/edge-agent && scripts/install.sh --from {wheel} --broker mqtt://localhost:1883 "
            f"--device-id {DEVICE}",
            timeout=1800,
        )
        took = self.now() - t0
        dist_info = f"{VENV}/../lib/python3*/site-packages/edge_agent-{version}.dist-info"
        origin = vm.sh(f"cat {dist_info}/direct_url.json", check=False).stdout  # pip's record of the source
        if installed_wheel(origin) != Path(wheel).name:
            raise CheckError(f"edge-agent was not installed from {wheel}: its direct_url.json says {origin!r}")
        enabled = vm.sh(f"systemctl is-enabled {UNIT}", check=False).stdout.strip()
        active = self.wait(
            "active", lambda: vm.sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "active", 120
        )
        source = "/dev/video0" in vm.sh("cat /etc/edge-agent/agent.yaml").stdout
        if enabled != "enabled" or not active or not source:
            raise CheckError(
                f"enabled={enabled} active={active} camera /dev/video0 in agent.yaml={source}: {out.stdout}"
            )
        vm.sh("cp -p /etc/edge-agent/agent.yaml /etc/edge-agent/agent.yaml.installed")
        return {
            "install_s": round(took, 1),
            "from": Path(wheel).name,
            "enabled": enabled,
            "active": True,
            "source": "/dev/video0",
            "log": out.stdout.splitlines(),
        }

    def ready(self) -> dict[str, Any]:
        """Keys added as README says; `systemctl start` returns once the agent said READY=1."""
        shutil.rmtree(self.keys, ignore_errors=True)  # the operator's keys of this run only
        run([*host_cli(), "keygen", "--out", str(self.keys / "signing")], capture_output=True)
        run([*host_cli(), "keygen", "--out", str(self.keys / "operator")], capture_output=True)
        for name in ("signing", "operator"):
            pub = (self.keys / name / "signing.pub").read_bytes()
            self.vm.sh(f"cat > /etc/edge-agent/{name}.pub && chmod 0644 /etc/edge-agent/{name}.pub", stdin=pub)
        self.write_config()
        self.vm.sh(f"systemctl stop {UNIT}")
        out = self.vm.sh(f"a=$(date +%s.%N); systemctl start {UNIT}; b=$(date +%s.%N); echo $a $b").stdout.split()
        start_to_ready = float(out[1]) - float(out[0])
        p = self.show("ActiveState", "SubState", "StatusText", "Type", "NotifyAccess", "WatchdogUSec")
        if p["ActiveState"] != "active" or p["Type"] != "notify":
            raise CheckError(f"after systemctl start: {p}")
        self.page_port = self.vm.tunnel(8080)
        self.broker_port = self.vm.tunnel(1883)
        return {
            "start_to_ready_s": round(start_to_ready, 2),
            "status_text": p["StatusText"],
            "watchdog_usec": p["WatchdogUSec"],
        }

    def push(self) -> dict[str, Any]:
        """Signed bundles pushed from the host's CLI through the forwarded broker port."""
        bundles = {}
        for version in ("1.0.0", "1.1.0"):
            path = self.vm.work / f"demo-{version}.bundle"
            run(
                [*host_cli(), "bundle", "build", "--model", str(HERE / "agent/demo/demo_detector.onnx"),
                 "--model", str(HERE / "agent/demo/demo_detector_int8.tflite"), "--name", "demo", "--version", version,
                 "--key", str(self.keys / "signing/signing.key"), "-o", str(path)],
                capture_output=True,
            )  # fmt: skip
            bundles[version] = path
        broker = f"mqtt://127.0.0.1:{self.broker_port}"
        key = str(self.keys / "operator/signing.key")
        t0 = time.monotonic()
        out = self.cli("fleet", "push", str(bundles["1.0.0"]), "--target", f"device:{DEVICE}", "--broker", broker,
                       "--key", key, "--wait", "900")  # fmt: skip
        first = time.monotonic() - t0
        if "SUCCEEDED" not in out:
            raise CheckError(f"1.0.0: the CLI did not report SUCCEEDED: {out}")
        record = self.active_version_on_page("1.0.0", state="SUCCEEDED")
        return {"push_to_succeeded_s": round(first, 1), "probation_s": 30, "deployment": record["deployment"]["state"],
                "serving": record.get("serving"), "cli": out.splitlines()[-3:]}  # fmt: skip

    def active_version_on_page(self, version: str, state: str | None = None) -> dict[str, Any]:
        """The page's status once it serves `version` (and its deployment is in `state`): the page
        reuses a snapshot for up to a second, so the CLI's answer may be ahead of it."""

        def shown() -> dict[str, Any] | None:
            s: dict[str, Any] = self.api("/api/status")
            deployment = s.get("deployment") or {}
            if (s.get("bundle") or {}).get("version") != version:
                return None
            return s if state is None or deployment.get("state") == state else None

        what = f"the page serving demo {version}" + (f" with its deployment {state}" if state else "")
        return self.wait(what, shown, 120)  # type: ignore[no-any-return]

    def camera(self) -> dict[str, Any]:
        """The hardened unit reads /dev/video0 (vivid): frames inferred grow; the page shows cam0."""
        first = self.wait("cam0 frames", lambda: self.cam0()["frames"] > 0 and self.cam0(), 180)
        later = self.wait("cam0 frames growing", lambda: (c := self.cam0())["frames"] > first["frames"] and c, 60)
        jpeg = self.api("/api/cameras/cam0/snapshot.jpg")
        page = self.api("/")  # the page's HTML; its script draws each camera from /api/status and the JPEG
        (self.vm.work / "cam0.jpg").write_bytes(jpeg if isinstance(jpeg, bytes) else b"")
        if not (isinstance(jpeg, bytes) and jpeg[:2] == b"\xff\xd8"):
            raise CheckError("the page's cam0 snapshot is not a JPEG")
        denied = self.vm.sh(f"journalctl -u {UNIT} --no-pager | grep -ci 'permission denied' || true").stdout.strip()
        return {"source": later["source"], "fps": later["fps"], "frames": later["frames"],
                "source_status": later["source_status"], "snapshot_bytes": len(jpeg),
                "page_html_bytes": len(page),
                "snapshot": str(self.vm.work / "cam0.jpg"), "permission_denied_lines": int(denied or 0)}  # fmt: skip

    def cam0(self) -> dict[str, Any]:
        cams = self.api("/api/status")["cameras"]
        cam = cams["cam0"] if isinstance(cams, dict) else next(c for c in cams if c["name"] == "cam0")
        return cam  # type: ignore[no-any-return]

    def detect_runtimes(self) -> dict[str, Any]:
        """`edge-agent detect` in the installed venv on a synthetic scene, with ONNX Runtime and LiteRT.

        The wheels are the ones pip found for this VM's architecture (on arm64: the aarch64 wheels a
        Pi or a Jetson gets); each runtime must find the scene's shapes, and both the same number.
        """
        venv = "/opt/edge-agent/venv/bin"
        self.vm.sh(f"cd /root/edge-agent && {venv}/python scripts/make_demo_media.py /root/media --frames 2")
        found: dict[str, Any] = {}
        for runtime, model in (("onnxruntime", "demo_detector.onnx"), ("litert", "demo_detector_int8.tflite")):
            out = self.vm.sh(
                f"cd /root/edge-agent && {venv}/edge-agent detect agent/demo/{model} /root/media/scene.png "
                f"--runtime {runtime} --json"
            ).stdout
            records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            labels = sorted(d["label"] for r in records for d in r.get("detections", []))
            if not labels:
                raise CheckError(f"{runtime}: no detections on the scene: {out[-1500:]}")
            found[runtime] = {"model": model, "detections": len(labels), "labels": labels}
        if found["onnxruntime"]["detections"] != found["litert"]["detections"]:
            raise CheckError(f"the runtimes disagree on the scene: {found}")
        machine = self.vm.sh("uname -m").stdout.strip()
        return {"machine": machine, **found}

    def reload_bad(self) -> dict[str, Any]:
        """A broken agent.yaml reloaded: still active, same process, the refusal in the journal."""
        pid, since = self.main_pid(), self.now()
        self.vm.sh("cp -p /etc/edge-agent/agent.yaml /etc/edge-agent/agent.yaml.good && "
                   "sed -i 's/^  interval_s: 10/  interval_s: -5/' /etc/edge-agent/agent.yaml && "
                   "grep -q 'interval_s: -5' /etc/edge-agent/agent.yaml")  # fmt: skip
        try:
            self.vm.sh(f"systemctl reload {UNIT}")
            lines = self.wait(
                "the refusal in the journal",
                lambda: [ln for ln in self.journal(since).splitlines() if "keeping the running config" in ln],
                120,
            )
            p = self.show("ActiveState", "MainPID")
        finally:
            self.vm.sh("mv /etc/edge-agent/agent.yaml.good /etc/edge-agent/agent.yaml")
        if p["ActiveState"] != "active" or int(p["MainPID"]) != pid:
            raise CheckError(f"after a broken reload: {p} (was pid {pid})")
        return {"active": True, "same_pid": True, "journal": lines[-1:]}

    def reload_good(self) -> dict[str, Any]:
        pid, since = self.main_pid(), self.now()
        conf = self.vm.sh("cat /etc/edge-agent/agent.yaml").stdout
        if "    max_fps: 15" not in conf:
            raise CheckError("agent.yaml has no `max_fps: 15` to change")
        self.vm.sh("sed -i 's/^    max_fps: 15/    max_fps: 4/' /etc/edge-agent/agent.yaml")
        self.vm.sh(f"systemctl reload {UNIT}")
        cam = self.wait("cam0 at max_fps 4", lambda: (c := self.cam0()).get("max_fps") == 4 and c, 90)
        if self.main_pid() != pid:
            raise CheckError("the reload restarted the process")
        return {"max_fps": cam["max_fps"], "same_pid": True, "journal": self.journal(since).splitlines()[-3:]}

    def rollback(self) -> dict[str, Any]:
        broker = f"mqtt://127.0.0.1:{self.broker_port}"
        key = str(self.keys / "operator/signing.key")
        self.cli("fleet", "push", str(self.vm.work / "demo-1.1.0.bundle"), "--target", f"device:{DEVICE}",
                 "--broker", broker, "--key", key, "--wait", "900")  # fmt: skip
        newer = self.active_version_on_page("1.1.0", state="SUCCEEDED")
        out = self.cli(
            "fleet", "rollback", "--target", f"device:{DEVICE}", "--broker", broker, "--key", key, "--timeout", "300"
        )
        back = self.active_version_on_page("1.0.0")
        return {
            "pushed": "1.1.0",
            "deployment": newer["deployment"]["state"],
            "rolled_back_to": back["bundle"]["version"],
            "cli": out.splitlines()[-2:],
        }

    def watchdog(self) -> dict[str, Any]:
        before, pid, since = self.restarts(), self.main_pid(), self.now()
        self.vm.sh(f"kill -STOP {pid}")
        t0 = time.monotonic()
        self.wait(
            "a restart after SIGSTOP",
            lambda: self.restarts() > before and self.main_pid() not in (0, pid),
            WATCHDOG_S + RESTART_S + 60,
            1,
        )
        took = time.monotonic() - t0
        self.wait("active again", lambda: self.show("ActiveState")["ActiveState"] == "active", 120)
        reason = [ln for ln in self.journal(since).splitlines() if "watchdog" in ln.lower()]
        if not reason or took > WATCHDOG_S + RESTART_S + 10:
            raise CheckError(f"restart after {took:.0f} s, watchdog lines {reason}")
        return {"nrestarts_before": before, "nrestarts_after": self.restarts(), "stop_to_restart_s": round(took, 1),
                "limit_s": WATCHDOG_S + RESTART_S, "journal": reason[:2]}  # fmt: skip

    def kill9(self) -> dict[str, Any]:
        before, pid = self.restarts(), self.main_pid()
        self.vm.sh(f"kill -9 {pid}")
        t0 = time.monotonic()
        self.wait(
            "a restart after kill -9",
            lambda: self.restarts() == before + 1 and self.main_pid() not in (0, pid),
            60,
            0.5,
        )
        self.wait("active again", lambda: self.show("ActiveState")["ActiveState"] == "active", 120)
        return {
            "nrestarts_before": before,
            "nrestarts_after": self.restarts(),
            "kill_to_restart_s": round(time.monotonic() - t0, 1),
        }

    def dynsec(self) -> None:
        """The VM's broker with mosquitto's dynamic security plugin, as docs/fleet.md#setting-up-the-broker
        sets one up (tests/support/testkit/broker.py's `dynsec_broker`): no anonymous clients, the
        plugin's admin made by `mosquitto_ctrl dynsec init` (on the host: the image has no
        mosquitto-clients), the user `OPERATOR` with the roles admin and edge-operator."""
        ctrl = shutil.which("mosquitto_ctrl")
        if ctrl is None:
            raise CheckError("mosquitto_ctrl is missing on the host (apt-get install mosquitto-clients)")
        folder = self.vm.work / "dynsec"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        admin_password, operator_password = secrets.token_hex(16), secrets.token_hex(16)
        run(
            [ctrl, "dynsec", "init", str(folder / "dynamic-security.json"), "admin", admin_password],
            capture_output=True,
        )
        self.vm.sh(
            f"cat > {DYNSEC_JSON} && chown mosquitto:mosquitto {DYNSEC_JSON} && chmod 0600 {DYNSEC_JSON}",
            stdin=(folder / "dynamic-security.json").read_bytes(),
        )
        conf = "listener 1883 127.0.0.1\\nallow_anonymous false\\nplugin %s\\nplugin_opt_config_file %s\\n"
        self.vm.sh(
            f"plugin=$(ls /usr/lib/*/mosquitto_dynamic_security.so) && printf '{conf}' \"$plugin\" {DYNSEC_JSON} "
            "> /etc/mosquitto/conf.d/dynsec.conf && systemctl restart mosquitto"
        )
        admin = [ctrl, "-h", "127.0.0.1", "-p", str(self.broker_port), "-u", "admin", "-P", admin_password, "dynsec"]
        self.wait(
            "the broker with the plugin",
            lambda: subprocess.run([*admin, "listRoles"], capture_output=True, timeout=60).returncode == 0,
            120,
        )
        for command in (
            ["createRole", "edge-operator"],
            ["addRoleACL", "edge-operator", "publishClientSend", "edge/#", "allow"],
            ["createClient", OPERATOR, "-p", operator_password],
            ["addClientRole", OPERATOR, "admin"],
            ["addClientRole", OPERATOR, "edge-operator"],
        ):
            run([*admin, *command], capture_output=True)
        password = folder / "operator.password"
        password.write_text(operator_password + "\n")
        password.chmod(0o600)
        self.broker_auth = ["--username", OPERATOR, "--password-file", str(password)]

    def enrol_claim(self) -> dict[str, Any]:
        """The broker gets the dynamic security plugin; the operator makes a claim on the host; the
        device, named vm-1 (it asks for its hostname), is installed again with only the claim
        (`install.sh --from WHEEL --claim FILE`, the full agent.yaml moved aside so install.sh
        writes its minimal one) and the daemon enrols on its start; the operator approves; the
        agent, on the credentials it received, publishes its status on its own topics, read
        from the host. The later checks run on that config (the claim's camera and page, the
        approval's keys)."""
        self.dynsec()
        key = str(self.keys / "operator/signing.key")
        claim = self.vm.work / "dynsec" / "vm.claim"
        self.cli("fleet", "enrol", "claim", "vm", "--expires", "2h", "--claim-broker", "mqtt://localhost:1883",
                 "--out", str(claim), "--key", key, *self.broker_args())  # fmt: skip
        self.vm.sh("cat > /root/vm.claim && chmod 0600 /root/vm.claim", stdin=claim.read_bytes())
        self.vm.sh(f"echo {DEVICE} > /etc/hostname && hostname {DEVICE} && "
                   "mv /etc/edge-agent/agent.yaml /etc/edge-agent/agent.yaml.before-claim")  # fmt: skip
        t0 = time.monotonic()
        said = self.vm.sh(
            f"cd /root/edge-agent && scripts/install.sh --from {self.wheel} --claim /root/vm.claim", timeout=900
        ).stdout

        def request() -> dict[str, Any] | None:
            rows = self.cli_json("fleet", "enrol", "list", "--json")
            return next((r for r in rows if r.get("device") == DEVICE and not r["answered"]), None)

        row = self.wait("the device's enrolment request", request, 300, 5)
        # the status the anonymous agent left retained goes, so the one read is the enrolled agent's
        password = self.broker_auth[-1]
        pub = shutil.which("mosquitto_pub") or "mosquitto_pub"
        run([pub, "-h", "127.0.0.1", "-p", str(self.broker_port), "-u", OPERATOR, "-P",
             Path(password).read_text().strip(), "-t", f"edge/{DEVICE}/status", "-r", "-n"])  # fmt: skip
        self.cli("fleet", "enrol", "approve", row["request"], "--key", key,
                 "--trust-key", str(self.keys / "signing/signing.pub"),
                 "--operator-key", str(self.keys / "operator/signing.pub"), *self.broker_args())  # fmt: skip
        conf = self.wait(
            "the credentials in agent.yaml",
            lambda: "mqtt.password" in (c := self.vm.sh(f"cat {STATE_DIR}/agent.yaml").stdout) and c,
            300,
        )
        enrolled = time.monotonic() - t0
        user = re.search(r"^  username: (\S+)$", conf, re.MULTILINE)
        if user is None:
            raise CheckError(f"agent.yaml has no broker user after enrolling: {conf[-1500:]}")
        files = f"/etc/edge-agent/agent.yaml /etc/edge-agent/claim.json {STATE_DIR}/agent.yaml {STATE_DIR}/enrol"
        modes = self.vm.sh(f"stat -c '%n %U:%G %a' {files} {STATE_DIR}/enrol/*").stdout.splitlines()

        def online() -> dict[str, Any] | None:
            status = self.cli_json("fleet", "status", "--json").get(DEVICE, {}).get("status") or {}
            return status if status.get("state") == "online" else None

        status = self.wait("the enrolled agent's status, read from the host", online, 300, 5)
        t_online = time.monotonic()
        broker = self.page_status()["broker"]
        online_to_page = time.monotonic() - t_online
        if not broker.get("connected"):
            raise CheckError(f"the page says the broker is not connected: {broker}")
        return {
            "request": row["request"],
            "install_to_enrolled_s": round(enrolled, 1),
            "online_to_page_s": round(online_to_page, 1),  # the page served after the broker's status
            "username": user.group(1),
            "written": modes,
            "status": {k: status.get(k) for k in ("state", "device", "agent_version", "protocol")},
            "install": said.splitlines()[-3:],
        }

    def push_next_agent(self, broken: bool, state: str, code: str | None = None) -> AgentPush:
        """The next patch version of the running agent (this checkout, its version bumped; `broken`:
        one that raises at import) built on the host and pushed from the fleet as a signed agent
        bundle (`push_agent`); the CLI's exit status and words, the device's deployment record
        (what differs from one ended in `state` with the error `code`) and its switch record."""
        before = self.page_agent_version()
        version = bump_patch(before)
        wheel = agent_wheel(self.vm.work / "wheels", version, broken=broken)
        pid, restarts = self.main_pid(), self.restarts()
        pushed = self.push_agent(wheel, version)
        reports = self.deployment_record()
        problems = agent_deployment_problems(reports.get("deployment"), pushed["deployment"], version, state, code)
        return AgentPush(before, version, pid, restarts, pushed, reports, problems, self.switch_record())

    def agent_update(self) -> dict[str, Any]:
        """A+1 pushed from the fleet (`push_next_agent`): the deployment ends SUCCEEDED with A+1 in
        the device's status; the running agent execed it (same pid, no restart), it confirmed
        itself, the unit stays active on A+1."""
        p = self.push_next_agent(broken=False, state="SUCCEEDED")
        a1, said = p.version, p.pushed["said"]
        reported = (p.reports.get("status") or {}).get("agent_version")
        if p.pushed["rc"] != 0 or f"{DEVICE}: SUCCEEDED" not in said or p.problems or reported != a1:
            raise CheckError(
                f"fleet push --agent {a1} exited {p.pushed['rc']}: {p.problems}, the status says {reported!r}: "
                f"{p.reports}: {said[-1500:]}"
            )
        running = self.wait("the page on A+1", lambda: self.page_agent_version() == a1, PAGE_S)
        version = self.vm.sh(f"{STATE_DIR}/agents/current/bin/edge-agent --version").stdout.strip()
        now = self.show("ActiveState", "MainPID", "NRestarts")
        same = int(now["MainPID"]) == p.pid and int(now["NRestarts"]) == p.restarts  # an exec in place, no restart
        if (not running or a1 not in version or now["ActiveState"] != "active" or p.record["state"] != "confirmed"
                or p.record["current"] != a1 or not same):  # fmt: skip
            raise CheckError(f"after the push of {a1}: {now} (was pid {p.pid}), {version!r}, {p.record}")
        return {"from": p.before, "to": a1, "deployment": p.reports["deployment"]["state"],
                "status_agent_version": reported, "bundle_bytes": p.pushed["bundle_bytes"],
                **push_figures(p.pushed, "confirmed"), "record": p.record,
                "version": version, "same_pid": True, "nrestarts": [p.restarts, int(now["NRestarts"])],
                "cli": said.splitlines()[-2:]}  # fmt: skip

    def agent_rollback(self) -> dict[str, Any]:
        """An A+2 that raises at import, pushed from the fleet as A+1 was: systemd restarts it, the
        launcher switches back to A+1 after `MAX_STARTS` starts within `ROLLBACK_S` of the switch,
        A+1 reports the deployment ROLLED_BACK (AGENT_UPDATE_ROLLED_BACK); the unit ends active on A+1."""
        p = self.push_next_agent(broken=True, state="ROLLED_BACK", code="AGENT_UPDATE_ROLLED_BACK")
        a1, a2, said = p.before, p.version, p.pushed["said"]
        if p.pushed["rc"] == 0 or p.problems:  # the CLI exits 1 on a target that did not succeed
            raise CheckError(f"fleet push --agent {a2} exited {p.pushed['rc']}: {p.problems}: {said[-1500:]}")
        self.wait("active on A+1", lambda: self.show("ActiveState")["ActiveState"] == "active", 180)
        running = self.page_agent_version()
        crashes = self.restarts() - p.restarts
        took = push_figures(p.pushed, "rolled_back")
        rolled_back = took.get("switch_to_rolled_back_s")
        record = p.record
        if (running != a1 or record["state"] != "rolled_back" or record["version"] != a2 or record["current"] != a1
                or rolled_back is None or rolled_back > ROLLBACK_S or crashes != MAX_STARTS):  # fmt: skip
            raise CheckError(
                f"{took} (the rollback at most {ROLLBACK_S:.0f} s after the switch): running {running}, "
                f"{crashes} restarts, {record}"
            )
        return {"broken": a2, "back_on": running, "deployment": p.reports["deployment"]["state"],
                "error": p.reports["deployment"]["error"], **took, "limit_s": ROLLBACK_S,
                "restarts": crashes, "record": record, "cli": said.splitlines()[-2:]}  # fmt: skip

    def reboot(self) -> dict[str, Any]:
        """`systemctl reboot`: a new boot (another boot_id), the unit active, the same version and
        record, and the same edge-agent (after `agent_update`: the new one)."""
        before, boot_id = self.active_version(), self.vm.sh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        agent_before = self.page_agent_version()
        for t in self.vm.tunnels:
            t.terminate()
        self.vm.tunnels.clear()
        t0 = time.monotonic()
        self.vm.sh("systemctl reboot", check=False, timeout=30)
        self.wait(
            "a new boot",
            lambda: (
                self.vm.sh("cat /proc/sys/kernel/random/boot_id", check=False, timeout=30).stdout.strip()
                not in ("", boot_id)
            ),
            900,
            5,
        )
        self.wait(
            "active after the reboot",
            lambda: self.vm.sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "active",
            300,
        )
        took = time.monotonic() - t0
        after = self.active_version()
        self.page_port = self.vm.tunnel(8080)
        self.broker_port = self.vm.tunnel(1883)
        agent_after = self.page_agent_version()
        same = ("current", "previous", "deployment")
        if [before.get(k) for k in same] != [after.get(k) for k in same] or agent_after != agent_before:
            raise CheckError(f"before the reboot {before}, edge-agent {agent_before}; after {after}, {agent_after}")
        return {"reboot_to_active_s": round(took, 1), "status": after, "agent_version": agent_after}

    def security(self) -> dict[str, Any]:
        out = self.vm.sh(f"systemd-analyze security {UNIT} --no-pager").stdout
        exposure = exposure_of(out)
        if exposure > EXPOSURE_MAX:
            raise CheckError(f"exposure {exposure} > {EXPOSURE_MAX}")
        return {"exposure": exposure, "max": EXPOSURE_MAX}

    def journal_clean(self) -> dict[str, Any]:
        out = self.vm.sh(f"journalctl -u {UNIT} --no-pager -o cat").stdout
        bad = unplanted(tracebacks(out))
        if bad:
            raise CheckError(f"{len(bad)} tracebacks in the journal, the first: {bad[0][-2500:]}")
        return {"lines": len(out.splitlines()), "tracebacks": 0}

    def uninstall(self) -> dict[str, Any]:
        self.vm.sh("cd /root/edge-agent && scripts/install.sh --uninstall")
        gone = "test ! -e /etc/systemd/system/edge-agent.service && test ! -e /opt/edge-agent && "
        gone += "test ! -e /etc/edge-agent"
        left = self.vm.sh(f"{gone} && ! getent passwd edge-agent && ls /var/lib/edge-agent").stdout
        if not left.strip():
            raise CheckError("/var/lib/edge-agent is empty or gone after --uninstall")
        return {"kept": sorted(left.split())}

    def run_all(self, only: Sequence[str] = ()) -> None:
        """Run the checks of `CHECKS` in order: all of them, or those named in `only`."""
        for name, method in CHECKS.items():
            if not only or name in only:
                self.check(name, getattr(self, method))


#: every check by its JSON name, and the `Checks` method that runs it, in the order they run
#: (each may rely on those before it: `install` and `ready` come first in any subset)
CHECKS = {
    "install": "install",
    "ready": "ready",
    "detect_runtimes": "detect_runtimes",
    "push_probation": "push",
    "v4l2_camera": "camera",
    "reload_broken": "reload_bad",
    "reload_good": "reload_good",
    "rollback": "rollback",
    "watchdog_sigstop": "watchdog",
    "kill9": "kill9",
    "enrol_claim": "enrol_claim",
    "agent_update": "agent_update",
    "reboot": "reboot",
    "agent_rollback": "agent_rollback",
    "security": "security",
    "journal_clean": "journal_clean",
    "uninstall": "uninstall",
}


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------


def check_names(text: str) -> tuple[str, ...]:
    """``--checks``: names of `CHECKS`, comma-separated; an unknown name is refused, naming them all."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown check {', '.join(unknown) or repr(text)}: the checks are {', '.join(CHECKS)}"
        )
    return names


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/vm_test.sh",
        description="Boot a fresh Debian 12 VM, install edge-agent as README says and check the service "
        "(docs/service.md: what was seen on a booted system).",
    )
    parser.add_argument("--arch", choices=sorted(ARCHES), default=host_arch() if host_arch() in ARCHES else "amd64")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--keep", action="store_true", help="leave the VM running (then: exec CMD..., stop)")
    parser.add_argument(
        "--checks",
        type=check_names,
        default=(),
        metavar="NAME,...",
        help="run only these checks, in their usual order (install and ready first); default: all of them. "
        "arm64 by hand: install,ready,detect_runtimes,watchdog_sigstop,kill9,security,journal_clean",
    )
    parser.add_argument("--kvm-probe-s", type=float, default=30.0, help="seconds a KVM boot has to print (default 30)")
    parser.add_argument(
        "action",
        nargs="?",
        choices=["check", "exec", "stop", "probe-kvm"],
        default="check",
        help="check (default): build, boot, run the checks; exec CMD...; stop; "
        "probe-kvm: exit 0 when a KVM guest boots here (CI runs the checks only then)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="exec: the command, run as root in the VM")
    args = parser.parse_args(argv)
    if args.action == "exec" and not args.command:
        parser.error("exec needs a command: scripts/vm_test.sh exec systemctl status edge-agent")
    if args.action != "exec" and args.command:
        parser.error(f"unexpected arguments {args.command}")
    return args


def probe_only(arch: Arch, timeout: float) -> int:
    """Print whether a KVM guest boots here; 0 if it does."""
    if arch.name != host_arch() or not kvm_usable():
        print(f"no usable /dev/kvm for {arch.name} on this {host_arch()} host")
        return 1
    work = cache_root() / f"{arch.name}-probe"
    work.mkdir(parents=True, exist_ok=True)
    vm = Vm(arch, build_image(arch), work, "kvm")
    seen = kvm_probe(vm, timeout)
    vm.kill()
    print(f"KVM: {seen}")
    return 0 if seen == "booted" else 1


def main(argv: list[str]) -> int:
    args = parse(argv)
    arch = ARCHES[args.arch]
    if args.action == "exec":
        vm = Vm.load(arch)
        done = vm.sh(
            " ".join(shlex.quote(c) for c in args.command) if len(args.command) > 1 else args.command[0], check=False
        )
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        print(f"exit status {done.returncode}", file=sys.stderr)
        return done.returncode
    if args.action == "stop":
        vm = Vm.load(arch)
        vm.sh("systemctl poweroff", check=False, timeout=20)
        for _ in range(150):
            if not vm.alive():
                break
            time.sleep(0.2)
        vm.kill()
        log("stopped")
        return 0
    if shutil.which(arch.qemu) is None:
        raise SystemExit(f"vm_test: {arch.qemu} is missing (apt-get install qemu-system-x86 / qemu-system-arm)")
    if args.action == "probe-kvm":
        return probe_only(arch, args.kvm_probe_s)
    started = time.monotonic()
    cached = (image_dir(arch) / "done").exists()
    image = build_image(arch)
    built = time.monotonic()
    vm = start_vm(arch, image, args.kvm_probe_s)
    booted = time.monotonic()
    log(
        f"booted under {vm.accel} in {booted - built:.0f} s; "
        f"ssh -p {vm.ssh_port} root@127.0.0.1 -i {image / 'id_ed25519'}"
    )
    checks = Checks(vm)
    try:
        checks.run_all(args.checks)
    finally:
        if args.keep:
            for t in vm.tunnels:
                t.terminate()
            log(
                f"kept running: scripts/vm_test.sh --arch {arch.name} exec CMD...; "
                f"scripts/vm_test.sh --arch {arch.name} stop"
            )
        else:
            vm.sh("systemctl poweroff", check=False, timeout=20)
            vm.kill()
    result = {
        "arch": arch.name,
        "accel": vm.accel,
        "kvm_probe": vm.probe,
        "image_cached": cached,
        "image_build_s": round(built - started, 1),
        "boot_s": round(booted - built, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "only": list(args.checks),
        "ok": all(r["ok"] for r in checks.results.values()),
        "checks": checks.results,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, r in checks.results.items():
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {name}: {r.get('error', '')[:300]}")
        print(
            f"{arch.name} under {vm.accel}: {'all checks passed' if result['ok'] else 'FAILED'} "
            f"in {result['wall_s']:.0f} s"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

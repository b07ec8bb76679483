"""`scripts/vm_test.py`'s parts that run without a VM: arguments, qemu's command, the readings.

The whole driver against a booted VM is tests/e2e/test_booted_system.py (marker `vm`).
"""

from __future__ import annotations

import importlib.util
import io
import json
import socket
import struct
import sys
import tarfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from types import ModuleType

import pytest
from testkit import REPO

import agent

SCRIPT = REPO / "scripts" / "vm_test.py"


@pytest.fixture(scope="module")
def vm_test() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vm_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vm_test"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


REPORT = """  NAME                                                        DESCRIPTION   EXPOSURE
✗ PrivateNetwork=                                             Service has access to the host's network    0.5
✓ User=/DynamicUser=                                          Service runs under a static non-root user identity

→ Overall exposure level for edge-agent.service: 1.6 OK 🙂
"""


def test_the_exposure_is_read_from_the_overall_line(vm_test: ModuleType) -> None:
    assert vm_test.exposure_of(REPORT) == 1.6
    assert vm_test.exposure_of(REPORT.replace("1.6 OK", "2.1 OK")) == 2.1
    # as seen on the booted VM (no UTF-8 locale over SSH): the smiley is ASCII and has a colon
    assert vm_test.exposure_of("-> Overall exposure level for edge-agent.service: 1.7 OK :-)\n") == 1.7
    with pytest.raises(ValueError, match="no overall exposure level"):
        vm_test.exposure_of("Unit edge-agent.service not found.\n")


def test_tracebacks_are_found_whole_and_only_tracebacks(vm_test: ModuleType) -> None:
    journal = (
        "serving demo 1.0.0\n"
        "Traceback (most recent call last):\n"
        '  File "agent/daemon/agent.py", line 3, in run\n'
        "    boom()\n"
        "RuntimeError: boom\n"
        "broker connected\n"
        "a line naming the word traceback is not one\n"
    )
    found = vm_test.tracebacks(journal)
    assert found == [
        'Traceback (most recent call last):\n  File "agent/daemon/agent.py", line 3, in run\n    boom()\n'
        "RuntimeError: boom"
    ]
    assert vm_test.tracebacks("serving demo 1.0.0\nbroker connected\n") == []


def test_journal_clean_leaves_out_only_the_tracebacks_agent_rollback_planted(vm_test: ModuleType) -> None:
    planted = (
        "Traceback (most recent call last):\n"
        '  File "/var/lib/edge-agent/agents/0.2.2/bin/edge-agent", line 5, in <module>\n'
        f"RuntimeError: {vm_test.PLANTED_FAILURE}"
    )
    real = 'Traceback (most recent call last):\n  File "agent/daemon/agent.py", line 3, in run\nRuntimeError: boom'
    # the planted message quoted inside a real traceback does not hide it
    raising = f"    raise RuntimeError({vm_test.PLANTED_FAILURE!r})"
    quoted = f'Traceback (most recent call last):\n  File "x.py", line 1\n{raising}\nValueError: 3'
    journal = f"{planted}\nbroker connected\n{real}\nserving\n{quoted}\nserving\n"
    assert vm_test.unplanted(vm_test.tracebacks(journal)) == [real, quoted]
    assert vm_test.unplanted([planted]) == []


def test_the_update_s_version_is_the_next_patch_of_the_checkout_s(vm_test: ModuleType) -> None:
    assert vm_test.bump_patch("0.2.0") == "0.2.1"
    assert vm_test.bump_patch("0.2.9") == "0.2.10"
    assert vm_test.bump_patch("1.9.3-rc.1") == "1.9.4"
    with pytest.raises(ValueError, match="not a SemVer version"):
        vm_test.bump_patch("latest")
    init = '"""The package."""\n\n#: until 0.2.0 it said __version__ = "0.1.0" for ever\n__version__ = "0.2.0"\n'
    assert vm_test.agent_version_in(init) == "0.2.0"
    assert vm_test.agent_version_in((REPO / "agent/__init__.py").read_text()) == agent.__version__
    with pytest.raises(ValueError, match="no __version__"):
        vm_test.agent_version_in('version = "0.2.0"\n')


def test_the_rollback_check_counts_the_launcher_s_own_limits(vm_test: ModuleType) -> None:
    from agent.deployment import agent_switch

    assert (vm_test.MAX_STARTS, vm_test.CONFIRM_WITHIN_S) == (agent_switch.MAX_STARTS, agent_switch.CONFIRM_WITHIN_S)
    unit = (REPO / "systemd/edge-agent.service").read_text()
    assert f"RestartSec={vm_test.RESTART_S:.0f}s" in unit
    assert vm_test.ROLLBACK_S == vm_test.MAX_STARTS * (vm_test.RESTART_S + vm_test.START_S_TCG)


def test_qemu_forwards_ssh_on_the_host_s_loopback_only(vm_test: ModuleType, tmp_path: Path) -> None:
    vm = vm_test.Vm(vm_test.ARCHES["amd64"], tmp_path / "image", tmp_path, "tcg", ssh_port=40022)
    cmd = vm.qemu_command()
    netdev = cmd[cmd.index("-netdev") + 1]
    assert netdev == "user,id=net0,hostfwd=tcp:127.0.0.1:40022-:22"
    assert cmd[cmd.index("-accel") + 1] == "tcg" and cmd[cmd.index("-cpu") + 1] == "max"
    assert cmd[cmd.index("-smp") + 1] == "2"
    assert "console=ttyS0" in cmd[cmd.index("-append") + 1]


def test_under_kvm_qemu_takes_the_host_s_cpu(vm_test: ModuleType, tmp_path: Path) -> None:
    cmd = vm_test.Vm(vm_test.ARCHES["amd64"], tmp_path, tmp_path, "kvm", ssh_port=1).qemu_command()
    assert cmd[cmd.index("-accel") + 1] == "kvm" and cmd[cmd.index("-cpu") + 1] == "host"
    arm = vm_test.Vm(vm_test.ARCHES["arm64"], tmp_path, tmp_path, "tcg", ssh_port=1).qemu_command()
    assert arm[0] == "qemu-system-aarch64" and arm[arm.index("-machine") + 1] == "virt"
    assert "console=ttyAMA0" in arm[arm.index("-append") + 1]
    assert arm[arm.index("-cpu") + 1] == "cortex-a76", "a board's core, not `max` (SVE, pointer auth: slow)"


def test_the_checkout_copied_in_has_the_tracked_files_and_not_the_venv(vm_test: ModuleType) -> None:
    with tarfile.open(fileobj=io.BytesIO(vm_test.checkout_tar()), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert {
        "scripts/install.sh",
        "systemd/edge-agent.service",
        "pyproject.toml",
        "agent/demo/demo_detector.onnx",
    } <= names
    assert not any(n.startswith((".venv/", ".git/")) for n in names)


def test_exec_needs_a_command_and_stop_takes_none(vm_test: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert vm_test.parse(["--arch", "arm64", "exec", "systemctl", "status", "edge-agent"]).command == [
        "systemctl",
        "status",
        "edge-agent",
    ]
    with pytest.raises(SystemExit):
        vm_test.parse(["exec"])
    assert "exec needs a command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vm_test.parse(["stop", "now"])
    assert "unexpected arguments" in capsys.readouterr().err
    assert vm_test.parse(["--json", "--keep"]).action == "check"


def test_exec_without_a_kept_vm_says_how_to_start_one(
    vm_test: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGE_AGENT_VM_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="no amd64 VM is running \\(start one with --keep\\)"):
        vm_test.main(["--arch", "amd64", "exec", "true"])


def test_checks_names_a_subset_run_in_the_usual_order(
    vm_test: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert vm_test.parse([]).checks == ()
    assert vm_test.parse(["--checks", "watchdog_sigstop, install"]).checks == ("watchdog_sigstop", "install")
    with pytest.raises(SystemExit):
        vm_test.parse(["--checks", "install,watchdog"])
    assert "unknown check watchdog: the checks are install, ready, detect_runtimes" in capsys.readouterr().err

    checks = vm_test.Checks(type("Vm", (), {"work": tmp_path})())
    ran: list[str] = []
    for name, method in vm_test.CHECKS.items():
        assert callable(getattr(checks, method)), name
        setattr(checks, method, lambda name=name: ran.append(name) or {})
    checks.run_all(("watchdog_sigstop", "install"))
    assert ran == ["install", "watchdog_sigstop"]
    assert list(checks.results) == ["install", "watchdog_sigstop"]
    ran.clear()
    checks.run_all()
    assert ran == list(vm_test.CHECKS)


def test_commands_run_by_the_driver_print_to_stderr_so_json_stays_alone_on_stdout(
    vm_test: ModuleType, capfd: pytest.CaptureFixture[str]
) -> None:
    vm_test.run(["echo", "Creating regular file base.raw"])
    assert vm_test.run(["echo", "kept"], capture_output=True).stdout == "kept\n"
    out, err = capfd.readouterr()
    assert out == "" and "Creating regular file base.raw" in err


def test_the_pushed_deployment_is_read_from_what_fleet_push_said(vm_test: ModuleType) -> None:
    said = (
        "pushed edge-agent 0.2.1 (5123456 bytes, 20 chunks, sha256 0123456789ab) to device:vm-1 as deployment "
        "edge-agent-0.2.1-k3j4\nvm-1: SUCCEEDED\n"
    )
    assert vm_test.pushed_deployment(said) == "edge-agent-0.2.1-k3j4"
    with pytest.raises(ValueError, match="fleet push named no deployment"):
        vm_test.pushed_deployment("edge-agent: error: bundle file not found: x.bundle\n")


def _record(**fields: object) -> dict[str, object]:
    record: dict[str, object] = {"id": "d2", "kind": "agent", "version": "0.2.2", "state": "ROLLED_BACK"}
    record["error"] = {"code": "AGENT_UPDATE_ROLLED_BACK", "message": "0.2.2 did not confirm within 3 starts"}
    return {**record, **fields}


@pytest.mark.parametrize(
    ("record", "problems"),
    [
        (_record(), []),
        # the retained record of the deployment before (A+1's) until the device publishes this one
        (_record(id="d1", version="0.2.1", state="SUCCEEDED", error=None),
         ["id 'd1', not 'd2'", "version '0.2.1', not '0.2.2'", "state 'SUCCEEDED', not 'ROLLED_BACK'",
          "error code None, not 'AGENT_UPDATE_ROLLED_BACK'"]),
        (_record(state="FAILED"), ["state 'FAILED', not 'ROLLED_BACK'"]),
        (_record(error={"code": "INTERRUPTED", "message": "stopped"}),
         ["error code 'INTERRUPTED', not 'AGENT_UPDATE_ROLLED_BACK'"]),
        (_record(kind=None), ["kind None, not 'agent'"]),  # a model bundle's deployment
        (None, ["the device published no deployment record"]),
    ],
)  # fmt: skip
def test_an_agent_deployment_is_judged_by_its_own_record(
    vm_test: ModuleType, record: dict[str, object] | None, problems: list[str]
) -> None:
    found = vm_test.agent_deployment_problems(record, "d2", "0.2.2", "ROLLED_BACK", "AGENT_UPDATE_ROLLED_BACK")
    assert found == problems


def test_a_succeeded_agent_deployment_has_no_error(vm_test: ModuleType) -> None:
    succeeded = _record(version="0.2.1", state="SUCCEEDED", error=None)
    assert vm_test.agent_deployment_problems(succeeded, "d2", "0.2.1", "SUCCEEDED") == []
    failed = _record(version="0.2.1", state="SUCCEEDED")
    assert vm_test.agent_deployment_problems(failed, "d2", "0.2.1", "SUCCEEDED") == [
        "error code 'AGENT_UPDATE_ROLLED_BACK', not None"
    ]


def test_an_agent_push_is_timed_from_the_switch(vm_test: ModuleType) -> None:
    pushed = {"push_to_switch_s": 61.04, "push_to_switch_end_s": 117.0, "push_to_end_s": 140.0}
    assert vm_test.push_figures(pushed, "rolled_back") == {
        "push_to_switch_s": 61.0,
        "switch_to_rolled_back_s": 56.0,  # the limit's measure: not the download and pip before it
        "switch_to_reported_s": 79.0,
    }
    unseen = {"push_to_switch_s": None, "push_to_switch_end_s": None, "push_to_end_s": 900.0}
    assert vm_test.push_figures(unseen, "confirmed") == {
        "push_to_switch_s": None,
        "switch_to_confirmed_s": None,
        "switch_to_reported_s": None,
    }


WHEEL_URL = "file:///var/tmp/edge-agent-wheels/edge_agent-0.2.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("direct_url", "wheel"),
    [
        # what pip 23 (Debian 12's venv) writes for `pip install FILE.whl`
        (json.dumps({"archive_info": {"hash": "sha256=b773b0", "hashes": {"sha256": "b773b0"}}, "url": WHEEL_URL}),
         "edge_agent-0.2.0-py3-none-any.whl"),
        (json.dumps({"dir_info": {}, "url": "file:///root/edge-agent"}), None),  # install.sh from the checkout
        (json.dumps({"archive_info": {}, "url": "https://example.org/edge_agent-0.2.0.tar.gz"}), None),
        ("", None),  # no direct_url.json: installed from an index
        ("None\n", None),
    ],
)  # fmt: skip
def test_the_install_check_knows_a_wheel_install_from_the_checkout_s(
    vm_test: ModuleType, direct_url: str, wheel: str | None
) -> None:
    assert vm_test.installed_wheel(direct_url) == wheel


class _Tunnel(ThreadingHTTPServer):
    """The host's end of `Vm.tunnel` (ssh -L) to a page that is not served yet: the first
    `refused` connections are closed unread, as ssh closes one whose channel the VM's port
    refused (a reset), then the page's /api/status answers."""

    def __init__(self, refused: int) -> None:
        self.refused = refused
        self.connections = 0
        tunnel = self

        class Page(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def handle(self) -> None:
                tunnel.connections += 1
                if tunnel.connections <= tunnel.refused:
                    self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # closed with the request unread: an RST
                super().handle()

            def do_GET(self) -> None:
                body = json.dumps({"broker": {"connected": True}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Page)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        request.close()  # no FIN before the reset


def test_the_page_is_read_once_it_answers_after_the_agent_s_start(vm_test: ModuleType, tmp_path: Path) -> None:
    # enrol_claim read the page the moment the enrolled agent was online on the broker, before
    # the agent served it: "[Errno 104] Connection reset by peer" through the tunnel
    tunnel = _Tunnel(refused=2)
    Thread(target=tunnel.serve_forever, daemon=True).start()
    try:
        checks = vm_test.Checks(vm_test.Vm(vm_test.ARCHES["amd64"], tmp_path, tmp_path))
        checks.page_port = tunnel.server_address[1]
        assert checks.page_status()["broker"] == {"connected": True}
        assert tunnel.connections == 3
    finally:
        tunnel.shutdown()
        tunnel.server_close()

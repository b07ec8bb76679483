"""`agent.daemon.actions`: the actions the commands and the page share, on a real store without a
broker (no deployer): each refusal with its code, a rollback on the store, the same actions
behind `CommandActions` and `AgentControls`."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.bundles import install_versions
from testkit.snapshots import snapshot

from agent.bundles.store import Store
from agent.daemon.actions import DeviceActions
from agent.errors import CodedError
from agent.hardware.board import probe
from agent.serving.cameras import Cameras
from agent.snapshot import Health


def test_refusals_carry_their_codes(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    store.ensure()
    actions = DeviceActions(store, Cameras([], probe()), lambda: None)
    for act, code in [
        (actions.rollback, "NO_PREVIOUS"),
        (lambda: actions.restart_camera("ghost"), "NO_PIPELINE"),
        (lambda: actions.camera_jpeg(None), "NO_PIPELINE"),
        (lambda: actions.camera_reference("ghost"), "NO_PIPELINE"),
        (lambda: actions.accept_view("ghost"), "NO_PIPELINE"),
    ]:
        with pytest.raises(CodedError) as refused:
            act()
        assert refused.value.code == code, refused.value.message
    actions.serve_current()  # nothing installed: nothing to serve, nothing wrong
    assert actions.serving_error is None


def test_a_rollback_without_a_broker_switches_the_store_for_commands_and_page(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    v1, v2 = install_versions(tmp_path / "state", keys, bundles)
    store = Store(tmp_path / "state")
    actions = DeviceActions(store, Cameras([], probe()), lambda: None)
    commands = actions.commands(lambda: "online", lambda: 5.0)
    deployment = commands.rollback()
    assert (deployment.state, deployment.sha256, store.current_sha()) == ("ROLLED_BACK", v1.name, v1.name)
    controls = actions.controls(snapshot, lambda: Health(True), list)
    status = controls.rollback()  # back again: v2 was previous
    assert (status.state, status.sha256, store.current_sha()) == ("ROLLED_BACK", v2.name, v2.name)
    assert (commands.state(), commands.clock(), controls.events()) == ("online", 5.0, [])

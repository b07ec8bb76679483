"""`edge-agent run`: the daemon (`agent.daemon.agent.Agent`), until SIGTERM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.paths import DEFAULT_CONFIG

if TYPE_CHECKING:
    from agent.config.models import AgentConfig
    from agent.deployment.agent_switch import AgentDirs


def add_parser(commands: Any) -> None:
    """Add ``edge-agent run`` to the subparsers."""
    run = commands.add_parser(
        "run", help="run the agent daemon (enrolling first when agent.yaml has a claim and no broker)"
    )
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="agent.yaml")
    run.add_argument(
        "--root", type=Path, default=Path("/"), help="filesystem root to probe and read sensors from (for fake trees)"
    )


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys
    import time

    from agent import __version__
    from agent.config.loading import load_config
    from agent.daemon.agent import Agent
    from agent.deployment.agent_switch import (
        LAUNCHED_ENV,
        RESTART,
        AgentDirs,
        AgentWatch,
        Probation,
        base_environment,
        exec_agent,
        launch,
        running_environment,
    )
    from agent.hardware.board import probe

    config = load_config(args.config)
    enrolled = _enrol_first(config, args.config, args.root)
    if enrolled is not None:
        return enrolled
    config = load_config(args.config)  # with the credentials enrolment wrote, if it ran
    running = running_environment()
    dirs = AgentDirs(config.state_dir, base_environment())  # BASE_ENV stays: the deployer reads it too
    launched = os.environ.pop(LAUNCHED_ENV, None) is not None
    # the first start runs in the installed environment: its version may have been upgraded in place
    target = launch(dirs, running, launched, installed=None if launched else __version__)
    if target is not None:  # the agent's own version switch (docs/fleet.md#agent-updates)
        _say_switch(dirs, target)
        exec_agent(dirs, target, sys.argv[1:])
    root = logging.getLogger()
    root.setLevel(min(root.level, logging.getLevelName(config.log_level.upper())))  # -v can only add detail
    agent = Agent(config, probe(args.root), config_path=args.config, root=args.root)
    watch = AgentWatch(dirs, running, Probation.for_running(dirs, running, time.monotonic()))
    code = agent.run(watch)
    if code == RESTART:
        target = launch(dirs, running, launched=True) or running
        _say_switch(dirs, target)
        exec_agent(dirs, target, sys.argv[1:])
    return code


def _enrol_first(config: AgentConfig, config_path: Path, root: Path) -> int | None:
    """Enrol first when agent.yaml has no broker but a claim is named or found (docs/fleet.md#enrolment);
    None to go on serving, else the exit status."""
    import signal
    import threading

    from agent.cli.failure import CliError
    from agent.daemon.enrol_start import claim_to_use, enrol_on_start
    from agent.daemon.service import Service
    from agent.hardware.board import probe
    from agent.mqtt.enrolment import Claim, EnrolRefused

    path = claim_to_use(config)
    if path is None:
        return None
    try:
        claim = Claim.load(path)  # one that does not read changes nothing
    except EnrolRefused as exc:
        raise CliError(f"cannot enrol: {exc.message}") from exc
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return enrol_on_start(config, config_path, claim, path, Service.from_environment(), stop, probe(root))


def _say_switch(dirs: AgentDirs, target: Path) -> None:
    """Log the environment about to be exec'd, and why when it is a way back."""
    import logging

    log, record = logging.getLogger(__name__), dirs.record()
    if record is not None and record.state == "rolled_back" and record.reason:
        log.error("edge-agent %s rolled back: %s", record.version, record.reason)
    log.info("edge-agent: restarting into the environment %s", target)

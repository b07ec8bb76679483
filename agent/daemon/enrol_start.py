"""Enrolment on start: ``edge-agent run`` on a device that has only a claim (docs/fleet.md#enrolment).

`claim_to_use` decides: a config with an ``mqtt:`` section is enrolled (or set up by hand) and
never enrols; otherwise ``enrolment.claim``, else the first of ``enrolment.boot_claims`` that
exists. `enrol_on_start` then runs `agent.mqtt.enrol_device.enrol` (the code of ``edge-agent
enrol``) in one `Worker` while the main thread keeps systemd's contract: READY=1 with STATUS=
"waiting for enrolment approval" once the claim reads, the watchdog pinged every tick, SIGTERM
honoured. A failed attempt (the broker unreachable, the request not taken) is tried again after
`RETRY_MIN_S`, doubling up to `RETRY_MAX_S`, until the claim expires. A denial or an expiry is
final: recorded in ``<state_dir>/enrol/refused.json`` (read by `edge-agent doctor`), said in the
log and STATUS=, and the daemon exits with `NOT_ENROLLED`, a status the unit does not restart
on; a start with the same claim says so again without asking. The key pair and the request
sent are kept across restarts (`enrol_device.pending_request`).

While it waits the daemon serves the status page when agent.yaml has a ``status_page:`` section
(`start_page`, the same server, its bounds and password): `waiting_controls` hands it a snapshot
that carries only the device, its board and an `EnrolmentStatus` (waiting, the request id the
operator approves, since when, the next try after a failed one), which the page shows as its
one problem and ``/api/status`` carries; its actions refuse (nothing runs yet). After a final
refusal the page, if served, stays up saying so (denied, the claim expired) until SIGTERM, and
the daemon then exits with `NOT_ENROLLED`; without a page it exits at once. An approval stops
the page before the agent starts its own on the same address. The page's threads read the
status, the enrol worker and the main thread replace it (`Shown`: one reference assignment).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent import __version__
from agent.config.models import AgentConfig
from agent.daemon.page import start_page
from agent.daemon.service import Service
from agent.errors import CodedError, ErrorCode
from agent.hardware.board import Board
from agent.mqtt.enrol_device import enrol
from agent.mqtt.enrolment import Claim, EnrolRefused, EnrolRequest, read_bounded
from agent.snapshot import AgentSnapshot, DeploymentStatus, EnrolmentState, EnrolmentStatus, EventCounts, Health
from agent.throttle import ThrottledLog
from agent.web.controls import AgentControls
from pipelines.worker import Worker
from runtimes.files import atomic_write

if TYPE_CHECKING:
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)

#: the first wait after a failed attempt (seconds); each further one doubles, up to `RETRY_MAX_S`
RETRY_MIN_S = 5.0
RETRY_MAX_S = 300.0
#: the exit status of a daemon whose claim was denied or expired (systemd's unit does not restart on it)
NOT_ENROLLED = 78
#: the record of a final refusal, in ``<state_dir>/enrol/``
REFUSED = "refused.json"
WAITING = "waiting for enrolment approval"


def claim_to_use(config: AgentConfig) -> Path | None:
    """The claim to enrol with, None when the device is enrolled or has no claim."""
    if config.mqtt is not None:
        return None
    if config.enrolment.claim is not None:
        return config.enrolment.claim
    return next((path for path in config.enrolment.boot_claims if path.is_file()), None)


@dataclass(frozen=True)
class Refusal:
    """A final no for one claim: its name, the error code and the words."""

    claim: str
    code: str
    reason: str

    @classmethod
    def read(cls, state_dir: Path) -> Refusal | None:
        path = state_dir / "enrol" / REFUSED
        if not path.exists():
            return None
        try:
            raw = json.loads(read_bounded(path, 4096, "the refusal record"))
            return cls(str(raw["claim"])[:200], str(raw["code"])[:40], str(raw["reason"])[:600])
        except (EnrolRefused, ValueError, KeyError, TypeError):
            return None

    def write(self, state_dir: Path) -> None:
        body = {"claim": self.claim, "code": self.code, "reason": self.reason}
        atomic_write(state_dir / "enrol" / REFUSED, json.dumps(body).encode())

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class _Stopped(Exception):
    """SIGTERM while enrolling."""


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (1, 2, ...)."""
    return float(min(RETRY_MAX_S, RETRY_MIN_S * 2 ** min(attempt - 1, 16)))


def enrol_on_start(
    config: AgentConfig,
    config_path: Path,
    claim: Claim,
    claim_path: Path,
    service: Service,
    stop: threading.Event,
    board: Board,
    clock: Callable[[], float] = time.time,
) -> int | None:
    """Enrol with the claim at `claim_path`, keeping systemd's contract meanwhile and serving the
    status page (`board`: this device's, for it); None once agent.yaml has the credentials,
    `NOT_ENROLLED` on a final refusal (after SIGTERM while the page says so), 0 when `stop` was set."""
    state_dir = config.state_dir
    device_id = config.device.id if config.device.id else _hostname()
    shown = Shown(EnrolmentStatus("waiting", claim.claim, device_id, None, clock()))
    with _page(config, device_id, board, shown, clock) as page:
        refused = Refusal.read(state_dir)
        if refused is not None and refused.claim == claim.claim:
            return _final(service, claim_path, refused, True, shown, page, stop)
        outcome: list[BaseException | None] = []
        throttled = ThrottledLog(log)

        def answered_or_stopped(answered: threading.Event) -> bool:
            while not answered.wait(0.5):
                if stop.is_set():
                    raise _Stopped
                if clock() >= claim.expires_at:
                    raise EnrolRefused(
                        ErrorCode.ENROL_EXPIRED, f"the claim {claim.claim} expired before an answer came"
                    )
            return True

        def said(request: EnrolRequest) -> None:
            log.warning(
                "enrolment: asked to join as %s with the claim %s (request %s); %s (edge-agent fleet enrol list)",
                request.device_id,
                claim_path,
                request.request_id,
                WAITING,
            )
            shown.status = replace(
                shown.status, request_id=request.request_id, since=request.issued_at, next_retry=None
            )

        def attempts() -> None:
            attempt = 0
            while True:
                attempt += 1
                try:
                    enrol(
                        claim,
                        state_dir,
                        config_path,
                        device_id,
                        config.device.group,
                        clock=clock,
                        on_request=said,
                        wait_answer=answered_or_stopped,
                    )
                    outcome.append(None)
                    return
                except (EnrolRefused, _Stopped, OSError) as exc:
                    final = isinstance(exc, _Stopped) or (
                        isinstance(exc, EnrolRefused) and exc.code in (ErrorCode.ENROL_DENIED, ErrorCode.ENROL_EXPIRED)
                    )
                    delay = backoff(attempt)
                    if not final and clock() + delay >= claim.expires_at:
                        exc = EnrolRefused(
                            ErrorCode.ENROL_EXPIRED, f"the claim {claim.claim} expired while retrying: {exc}"
                        )
                        final = True
                    if final:
                        outcome.append(exc)
                        return
                    shown.status = replace(shown.status, next_retry=clock() + delay, reason=str(exc)[:300])
                    throttled.warning("enrol-retry", "enrolment: %s; trying again in %.0f s", exc, delay)
                    if stop.wait(delay):
                        outcome.append(_Stopped())
                        return

        worker = Worker.once("enrol", attempts, described="enrolment")
        status = f"{WAITING} (claim {claim.claim})"
        service.ready(None, lambda: status)
        worker.start()
        while worker.alive and not stop.is_set():  # a set `stop` ends the worker's wait too
            service.tick(lambda: Health(ok=True), lambda: status)
            stop.wait(service.tick_s)
        worker.stop(10.0, finish=True)
        if stop.is_set() and (not outcome or isinstance(outcome[0], _Stopped)):  # SIGTERM, the attempt unfinished
            service.stopping()
            return 0
        error = outcome[0] if outcome else RuntimeError("the enrolment worker ended without an outcome")
        if error is None:
            log.warning("enrolment: approved; %s now holds this device's credentials", config_path)
            service.notifier.send("STATUS=enrolled; starting")
            return None
        if isinstance(error, EnrolRefused):
            refusal = Refusal(claim.claim, str(error.code), error.message)
            refusal.write(state_dir)
            return _final(service, claim_path, refusal, False, shown, page, stop)
        raise error


@contextmanager
def _page(
    config: AgentConfig, device_id: str, board: Board, shown: Shown, clock: Callable[[], float]
) -> Iterator[StatusServer | None]:
    """The status page while the device waits (None: not configured, or it cannot start),
    stopped at the end: before the agent serves its own on the same address."""
    page = start_page(config.status_page, lambda: waiting_controls(config, device_id, board, shown, clock))
    try:
        yield page
    finally:
        if page is not None:
            page.stop()


def _final(
    service: Service,
    claim_path: Path,
    refusal: Refusal,
    recorded: bool,
    shown: Shown,
    page: StatusServer | None,
    stop: threading.Event,
) -> int:
    """Say the refusal (log, STATUS=, the page); with a page, keep it up until SIGTERM."""
    again = " (recorded before; not asked again)" if recorded else ""
    log.error(
        "enrolment refused%s: %s. This device will not serve until it is given a new claim "
        "(edge-agent fleet enrol claim) in place of %s",
        again,
        refusal,
        claim_path,
    )
    status = f"enrolment refused: {refusal}"[:500]
    service.notifier.send(f"STATUS={status}")
    state: EnrolmentState = "denied" if refusal.code == ErrorCode.ENROL_DENIED else "expired"
    shown.status = replace(shown.status, state=state, next_retry=None, reason=refusal.reason)
    if page is not None:  # the technician at the device reads why on the page, until the service stops
        service.ready(None, lambda: status)
        while not stop.wait(service.tick_s):
            service.tick(lambda: Health(ok=True), lambda: status)
        service.stopping()
    return NOT_ENROLLED


class Shown:
    """The enrolment's state as the page shows it: replaced whole by the enrol worker and the
    main thread, read by the page's threads."""

    def __init__(self, status: EnrolmentStatus) -> None:
        self.status = status


def waiting_controls(
    config: AgentConfig, device_id: str, board: Board, shown: Shown, clock: Callable[[], float] = time.time
) -> AgentControls:
    """What the status page reads while the device waits for enrolment: a snapshot with only
    the device, its board and `shown`'s status; every action refused, nothing runs yet."""

    def snapshot() -> AgentSnapshot:
        return AgentSnapshot(
            ts=clock(),
            state="starting",
            device=device_id,
            group=config.device.group,
            agent_version=__version__,
            board=board,
            bundle=None,
            previous=None,
            serving=None,
            serving_error=None,
            deployment=None,
            deployment_problem=None,
            cameras=(),
            broker=None,
            system=None,
            events=EventCounts(published=0, suppressed=0),
            enrolment=shown.status,
        )

    def refuse(code: ErrorCode) -> CodedError:
        return CodedError(code, f"this device is not enrolled yet ({shown.status.state}): nothing runs")

    def rollback() -> DeploymentStatus:
        raise refuse(ErrorCode.NO_PREVIOUS)

    def restart(camera: str) -> list[str]:
        raise refuse(ErrorCode.NO_PIPELINE)

    def camera_jpeg(camera: str, quality: int) -> bytes:
        raise refuse(ErrorCode.NO_FRAME)

    return AgentControls(
        snapshot=snapshot,
        health=lambda: Health(ok=True),
        rollback=rollback,
        restart=restart,
        camera_jpeg=camera_jpeg,
        events=lambda: [],
    )


def _hostname() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "edge-agent"

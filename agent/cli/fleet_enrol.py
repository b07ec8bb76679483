"""`edge-agent fleet enrol claim|list|approve|deny` and `fleet retire`: enrolment by claim, the
operator's side (`agent.fleet.enrolments`; docs/fleet.md#enrolment). The broker user given must hold
the dynamic security plugin's admin role."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.failure import CliError
from agent.cli.fleet_rollout import duration

if TYPE_CHECKING:
    from agent.mqtt.link import MqttLink
    from agent.mqtt.protocol import Topics


def add_enrol_parsers(fleet_actions: Any) -> tuple[list[argparse.ArgumentParser], list[argparse.ArgumentParser]]:
    """``fleet enrol claim|list|approve|deny`` and ``fleet retire``: (every parser that talks to
    the broker, those that sign; `fleet` adds the broker and key arguments)."""
    enrol = fleet_actions.add_parser("enrol", help="claims, and devices asking to join (enrolment by claim)")
    actions = enrol.add_subparsers(dest="enrol_command", required=True, metavar="ACTION")
    claim = actions.add_parser("claim", help="make a claim: a broker client that may only ask to join")
    claim.add_argument("name", help="the claim's name (letters, digits, '_', '-', '.')")
    claim.add_argument("--expires", type=duration, required=True, metavar="DURATION", help="valid this long (7d, 12h)")
    claim.add_argument("--group", help="the group its devices ask for")
    claim.add_argument("--claim-broker", metavar="URL", help="the broker URL devices use (default: --broker)")
    claim.add_argument("--out", type=Path, required=True, help="the claim file to write (0600; hand it to installers)")
    listing = actions.add_parser("list", help="requests waiting for an answer (--all: answered too)")
    listing.add_argument("--all", action="store_true", help="the answered requests too")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    approve = actions.add_parser("approve", help="create the device's broker client and role, and answer it")
    approve.add_argument("request_id", metavar="ID")
    approve.add_argument(
        "--trust-key", type=Path, action="append", default=[], help="a bundle signing public key the device trusts"
    )
    approve.add_argument(
        "--operator-key", type=Path, action="append", default=[], help="an operator public key (default: --key's)"
    )
    approve.add_argument(
        "--max-age", type=duration, default=24 * 3600.0, metavar="DURATION", help="refuse older requests (24h)"
    )
    deny = actions.add_parser("deny", help="refuse a request (the device is told, signed)")
    deny.add_argument("request_id", metavar="ID")
    deny.add_argument("--reason", default="denied by the operator")
    policy = actions.add_parser("policy", help="write a signed auto-approval policy for a claim (no broker needed)")
    policy.add_argument("claim", help="the claim whose requests it approves")
    policy.add_argument("--board", action="append", default=[], metavar="GLOB", help="board pattern (repeatable)")
    policy.add_argument("--serial", action="append", default=[], metavar="GLOB", help="serial pattern (repeatable)")
    policy.add_argument("--count", type=int, required=True, help="most devices approved on the claim in all")
    policy.add_argument("--expires", type=duration, required=True, metavar="DURATION", help="valid this long")
    policy.add_argument("--out", type=Path, required=True, help="the policy file to write")
    auto = actions.add_parser("auto", help="approve the requests a signed policy matches, every --every seconds")
    auto.add_argument("--policy", type=Path, required=True, help="the policy file (fleet enrol policy)")
    auto.add_argument(
        "--operator-key", type=Path, action="append", default=[], help="a public key the policy may be signed by"
    )
    auto.add_argument("--every", type=duration, default=10.0, metavar="DURATION", help="between passes (10s)")
    auto.add_argument("--once", action="store_true", help="one pass, then exit")
    retire = fleet_actions.add_parser("retire", help="delete a device's broker client and role (it cannot connect)")
    retire.add_argument("device")
    return [claim, listing, approve, deny, policy, auto, retire], [claim, approve, deny, policy, auto]


def fleet_enrol(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.enrolments import Dynsec, approve, create_claim, deny, requests
    from agent.mqtt.enrolment import EnrolRefused, pem
    from runtimes.files import atomic_write

    if args.enrol_command == "list":
        return _list(args, requests(link, topics, args.listen))
    key = args.signing_key  # read by `fleet` before it connected
    if key is None:
        raise CliError(f"fleet enrol {args.enrol_command} signs: give --key (or $EDGE_AGENT_OPERATOR_KEY)")
    now = time.time()
    try:
        if args.enrol_command == "claim":
            keys = [pem(key.public_key())]
            broker = args.claim_broker or args.broker
            claim = create_claim(Dynsec(link), topics, args.name, broker, keys, now + args.expires, args.group)
            atomic_write(args.out, json.dumps(claim.model_dump(mode="json"), indent=2).encode())
            args.out.chmod(0o600)
            print(f"wrote the claim {args.name} to {args.out}: valid until {time.ctime(claim.expires_at)}")
        elif args.enrol_command == "approve":
            trust = [path.read_text() for path in args.trust_key]
            operators = [path.read_text() for path in args.operator_key]
            answer = approve(
                link, Dynsec(link), topics, args.request_id, key, now, trust, operators, args.listen, args.max_age
            )
            print(f"approved {answer.device_id}" + (f" in group {answer.group}" if answer.group else ""))
        elif args.enrol_command == "auto":
            return _auto(args, link, topics, key)
        else:
            deny(link, topics, args.request_id, key, now, args.reason)
            print(f"denied request {args.request_id}")
    except EnrolRefused as exc:
        hint = f" (fleet enrol deny {args.request_id} tells the device)" if args.enrol_command == "approve" else ""
        raise CliError(f"{exc}{hint}") from exc
    except OSError as exc:
        raise CliError(f"cannot read or write a file: {exc}") from exc
    return 0


def _list(args: argparse.Namespace, found: list[Any]) -> int:
    shown = [p for p in found if args.all or not p.answered]
    rows = []
    for pending in shown:
        request = pending.request
        row = {"claim": pending.claim, "request": pending.request_id, "answered": pending.answered}
        if request is not None:
            hardware = request.hardware
            row |= {"device": request.device_id, "group": request.group, "board": hardware.board}
            row |= {"serial": hardware.serial, "mac": hardware.mac, "issued_at": request.issued_at}
        else:
            row["problem"] = pending.problem
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        what = row.get("problem") or f"{row['device']} ({row['board']}, serial {row['serial']}, {row['mac']})"
        state = "answered" if row["answered"] else "waiting"
        print(f"{row['request']}  {row['claim']:<12} {state:<8} {what}")
    if not rows:
        print("no requests waiting")
    return 0


def fleet_retire(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.enrolments import Dynsec, retire

    retire(Dynsec(link), args.device)
    print(f"retired {args.device}: its broker client and role are deleted")
    return 0


def write_policy(args: argparse.Namespace) -> int:
    """``fleet enrol policy``: sign and write the policy (before any broker is contacted)."""
    from agent.bundles.signing import load_private_key
    from agent.fleet.enrol_policy import EnrolPolicy, sign_policy
    from runtimes.files import atomic_write

    if args.key is None:
        raise CliError("fleet enrol policy signs: give --key (or $EDGE_AGENT_OPERATOR_KEY)")
    now = time.time()
    try:
        policy = EnrolPolicy(
            claim=args.claim,
            boards=args.board,
            serials=args.serial,
            count=args.count,
            expires_at=now + args.expires,
            issued_at=round(now, 3),
        )
    except ValueError as exc:
        raise CliError(f"the policy: {exc}") from exc
    atomic_write(args.out, sign_policy(policy, load_private_key(Path(args.key))).model_dump_json(indent=2).encode())
    until = time.ctime(policy.expires_at)
    print(f"wrote the policy for claim {args.claim} to {args.out}: at most {args.count}, until {until}")
    return 0


def _auto(args: argparse.Namespace, link: MqttLink, topics: Topics, key: Any) -> int:
    from agent.bundles.signing import load_public_key
    from agent.fleet.enrol_policy import auto_approve, load_policy
    from agent.fleet.enrolments import Dynsec

    keys = [load_public_key(path) for path in args.operator_key] or [key.public_key()]
    policy = load_policy(args.policy, keys)
    dynsec = Dynsec(link)
    while True:
        for outcome in auto_approve(link, dynsec, topics, policy, key, time.time(), args.listen):
            print(
                f"{outcome.request_id}  {outcome.device}  {'approved' if outcome.approved else 'left'}: {outcome.why}"
            )
        if args.once:
            return 0
        time.sleep(args.every)

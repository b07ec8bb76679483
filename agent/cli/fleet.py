"""`edge-agent fleet push|status|rollback|snapshot|media|samples|release|gc|acl|rollout|enrol|retire`:
the operator's side (docs/mqtt.md, docs/security.md); staged rollouts in agent/cli/fleet_rollout.py,
samples for retraining in agent/cli/fleet_samples.py, enrolment in agent/cli/fleet_enrol.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.args import unit_interval
from agent.cli.failure import CliError
from agent.cli.fleet_enrol import add_enrol_parsers, fleet_enrol, fleet_retire, write_policy
from agent.cli.fleet_rollout import (
    add_rollout_commands,
    add_staging_arguments,
    duration,
    fleet_rollout,
    follow_rollout,
    staging,
)
from agent.cli.fleet_samples import add_samples_parser, check_samples_arguments, fleet_samples

if TYPE_CHECKING:
    from agent.config.models import MqttSection
    from agent.fleet.state import DeviceReports
    from agent.fleet.versions import VersionSpec
    from agent.mqtt.link import MqttLink
    from agent.mqtt.protocol import Topics
    from agent.mqtt.quality_request import QualityRequest, ShadowRequest

#: the options of `fleet push` that shape a shadow, which one needs --shadow or --shadow-frames
SHADOW_OPTIONS = {"shadow_max": "--shadow-max", "min_agreement": "--min-agreement"}
SHADOW_OPTIONS |= {"shadow_mode": "--shadow-mode", "shadow_quiet": "--shadow-quiet"}


def _shadow_duration(text: str) -> float:
    """A duration above zero (and within a day, as the signed request allows)."""
    from agent.mqtt.quality_request import MAX_SHADOW_S

    seconds = duration(text)
    if not 0 < seconds <= MAX_SHADOW_S:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be above 0 and at most {MAX_SHADOW_S:g} s (1d)")
    return seconds


def _frames(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of frames") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value} frames is outside 1 .. 1000000")
    return value


def _add_quality_arguments(push: argparse.ArgumentParser) -> None:
    """The quality options of `fleet push` (docs/quality.md): signed with the document."""
    group = push.add_argument_group(
        "quality (docs/quality.md; signed with the document, each left out takes the device's agent.yaml)"
    )
    group.add_argument(
        "--shadow",
        type=_shadow_duration,
        metavar="DURATION",
        help="before switching, run the new version beside the serving one on live frames this long (30s, 10m, 2h) "
        "and compare their detections",
    )
    group.add_argument(
        "--shadow-frames", type=_frames, metavar="N", help="or until N frames were compared on each camera"
    )
    group.add_argument(
        "--shadow-max",
        type=_shadow_duration,
        metavar="DURATION",
        help="extend a quiet shadow (too few detections to compare) up to this long (default 4 x --shadow)",
    )
    group.add_argument(
        "--min-agreement",
        type=unit_interval,
        metavar="F",
        help="agreement (F1 against the serving version, per camera and per frequent class) below which the new "
        "version disagrees, 0..1 (device default 0.8)",
    )
    group.add_argument(
        "--shadow-mode",
        choices=("gate", "report"),
        help="gate: a version that disagrees ends REJECTED (SHADOW_DISAGREES); report: recorded, then it switches "
        "(device default gate)",
    )
    group.add_argument(
        "--shadow-quiet",
        choices=("pass", "fail"),
        help="how a shadow that saw too few detections up to --shadow-max ends (device default pass)",
    )
    group.add_argument(
        "--min-detection-ratio",
        type=unit_interval,
        metavar="F",
        help="on probation, the confident detections per frame the new version must keep, as a fraction of the "
        "previous version's just before the swap, 0..1 (else PROBATION_BLIND; device default 0.5)",
    )
    group.add_argument(
        "--probation-agreement",
        type=unit_interval,
        metavar="F",
        help="on probation, run the previous version beside the new one and hold the new one to this agreement "
        "with it on the same frames, 0..1: catches boxes in the wrong place, which the detection ratio does not "
        "see (else PROBATION_BLIND; device default 0: off)",
    )


def quality_requests(args: argparse.Namespace) -> tuple[ShadowRequest | None, QualityRequest | None]:
    """The shadow and quality requests `fleet push` signs; raises `CliError` for a shadow option
    given without --shadow (or --shadow-frames), or a --shadow-max below --shadow."""
    from pydantic import ValidationError

    from agent.mqtt.quality_request import QualityRequest, ShadowRequest

    quality = None
    if args.min_detection_ratio is not None or args.probation_agreement is not None:
        quality = QualityRequest(min_ratio=args.min_detection_ratio, min_agreement=args.probation_agreement)
    if args.shadow is None and args.shadow_frames is None:
        given = [flag for key, flag in SHADOW_OPTIONS.items() if getattr(args, key) is not None]
        if given:
            raise CliError(f"{given[0]} shapes a shadow: add --shadow DURATION (or --shadow-frames N)")
        return None, quality
    try:
        shadow = ShadowRequest(
            duration_s=args.shadow,
            frames=args.shadow_frames,
            max_s=args.shadow_max,
            min_agreement=args.min_agreement,
            mode=args.shadow_mode,
            quiet=args.shadow_quiet,
        )
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise CliError(f"--shadow-max: {problems}") from None
    return shadow, quality


def _clip_chunk_size(text: str) -> int:
    value = _chunk_size(text)
    if value > 1024 * 1024:
        raise argparse.ArgumentTypeError(f"chunk size {value} is over a clip's 1 MiB (1m)")
    return value


def _version_spec(text: str) -> VersionSpec:
    from agent.fleet.versions import VersionSpec

    try:
        return VersionSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _chunk_size(text: str) -> int:
    units = {"k": 1024, "m": 1024 * 1024}
    try:
        value = int(text[:-1]) * units[text[-1].lower()] if text[-1:].lower() in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 262144, 256k or 1m") from None
    if not 1024 <= value <= 64 * 1024 * 1024:
        raise argparse.ArgumentTypeError(f"chunk size {value} is outside 1 KiB .. 64 MiB")
    return value


def add_parser(commands: Any) -> None:
    """Add ``edge-agent fleet`` to the subparsers."""
    fleet = commands.add_parser("fleet", help="push bundles to devices and watch them (operator side)")
    fleet_actions = fleet.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    push = fleet_actions.add_parser("push", help="publish a bundle and make targets install it")
    push.add_argument("bundle", type=Path)
    push.add_argument("--target", required=True, help="device:ID or group:NAME")
    push.add_argument(
        "--agent",
        action="store_true",
        help="the bundle is an agent bundle (bundle build --agent): the targets update edge-agent itself",
    )
    push.add_argument(
        "--chunk-size",
        type=_chunk_size,
        help="bytes per chunk (default 256k); lowered to fit the broker's maximum packet size (MQTT 5 CONNACK)",
    )
    push.add_argument("--url", help="devices download the bundle from this HTTP(S) URL instead of the broker")
    push.add_argument(
        "--id", dest="deployment_id", help="the deployment's id (default: NAME-VERSION-RANDOM); waves depend on it"
    )
    push.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="install even where a higher version of this bundle succeeded (refused otherwise: DOWNGRADE_REFUSED)",
    )
    push.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the targets to finish (exit 1 if any fails); with --waves, follow the rollout "
        "and halt it past --max-failures (exit 1 when halted)",
    )
    _add_quality_arguments(push)
    add_staging_arguments(push)
    status = fleet_actions.add_parser("status", help="a table of devices")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--version-filter",
        type=_version_spec,
        metavar="SPEC",
        help="only devices whose agent version matches SPEC: <0.2.0, ==0.2.0, >=0.2.0,<0.3.0 (docs/fleet.md#versions)",
    )
    rollback = fleet_actions.add_parser("rollback", help="make targets return to their previous version")
    rollback.add_argument("--target", required=True, help="device:ID or group:NAME")
    rollback.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer")
    gc = fleet_actions.add_parser("gc", help="remove retained chunks that no desired document references")
    gc.add_argument("--dry-run", action="store_true", help="only list them")
    gc.add_argument(
        "--min-age",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="spare bundles pushed less than this long ago: a push in progress (default 600)",
    )
    snapshot = fleet_actions.add_parser("snapshot", help="save a device's latest annotated frame as JPEG")
    snapshot.add_argument("--target", required=True, help="device:ID")
    snapshot.add_argument("--camera", help="camera name (default: the first)")
    snapshot.add_argument("--pipeline", dest="camera", help=argparse.SUPPRESS)  # its old name, for one release
    snapshot.add_argument("-o", "--out", type=Path, required=True, help="JPEG file to write")
    snapshot.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    media = fleet_actions.add_parser(
        "media", help="save the snapshot (JPEG) or, with --clip, the clip (MP4) a device kept for an object event"
    )
    media.add_argument("device", help="the device's id")
    media.add_argument("event", help="the event's object_id (its 'snapshot' or 'clip' names the file)")
    media.add_argument(
        "--clip", action="store_true", help="fetch the event's clip, over MQTT in chunks checked by sha256"
    )
    media.add_argument("-o", "--out", type=Path, help="file to write (default: EVENT.jpg, with --clip EVENT.mp4)")
    media.add_argument(
        "--chunk-size",
        type=_clip_chunk_size,
        default=None,
        help="with --clip: bytes per chunk, 1k .. 1m (default 96k); lower it for a broker with a small maximum packet",
    )
    media.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    samples = add_samples_parser(fleet_actions)  # samples for retraining (issue 40 item 3)
    reference = fleet_actions.add_parser(
        "camera-reference",
        help="accept a camera's new view: its next frame becomes its health reference, so 'moved' clears (signed)",
    )
    reference.add_argument("device", help="the device's id")
    reference.add_argument("camera", help="the camera's name")
    reference.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    release = fleet_actions.add_parser("release", help="hand a device back to its group's desired document")
    release.add_argument("--target", required=True, help="device:ID")
    acl = fleet_actions.add_parser(
        "acl", help="print a mosquitto ACL limiting each device to its own topics (docs/security.md)"
    )
    acl.add_argument(
        "--device", action="append", default=[], metavar="ID[:GROUP]", help="a device (its broker user name) and group"
    )
    acl.add_argument("--devices-file", type=Path, help="a file of ID[:GROUP] lines (# comments allowed)")
    acl.add_argument(
        "--operator", action="append", default=[], metavar="USER", help="a broker user that may do everything"
    )
    acl.add_argument("--topic-root", default="edge", help="first level of every topic (default edge)")
    acl.add_argument(
        "--home-assistant",
        nargs="?",
        const="homeassistant",
        metavar="PREFIX",
        help="let the devices publish Home Assistant discovery under PREFIX (integrations.home_assistant's "
        "discovery_prefix, default homeassistant) and their frames, and read its birth (docs/integrations.md)",
    )
    acl.add_argument(
        "--home-assistant-user",
        action="append",
        default=[],
        metavar="USER",
        help="with --home-assistant: Home Assistant's broker user (reads the devices' states, all of PREFIX/#)",
    )
    rollout_parsers, signing_rollout_parsers = add_rollout_commands(fleet_actions)
    enrol_parsers, signing_enrol_parsers = add_enrol_parsers(fleet_actions)
    for parser in (push, status, rollback, gc, snapshot, media, samples, reference, release, *rollout_parsers):
        _broker_arguments(parser)
    for parser in enrol_parsers:
        _broker_arguments(parser)
    signing = (*signing_rollout_parsers, *signing_enrol_parsers)
    for parser in (push, rollback, snapshot, media, samples, reference, release, *signing):
        parser.add_argument(
            "--key",
            type=Path,
            default=os.environ.get("EDGE_AGENT_OPERATOR_KEY"),
            help="the operator's signing key (edge-agent keygen) for desired documents and commands; default "
            "$EDGE_AGENT_OPERATOR_KEY. Devices obey only what one of their operator_keys signed",
        )


def _broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker")
    group.add_argument(
        "--broker",
        default=os.environ.get("EDGE_AGENT_BROKER", "mqtt://localhost:1883"),
        help="mqtt://HOST[:PORT] or mqtts://... (default: $EDGE_AGENT_BROKER, else mqtt://localhost:1883)",
    )
    group.add_argument("--topic-root", default="edge", help="first level of every topic (default edge)")
    group.add_argument("--username")
    group.add_argument("--password-env", help="environment variable holding the password")
    group.add_argument("--password-file", type=Path, help="file whose first line is the password")
    group.add_argument("--ca-file", type=Path)
    group.add_argument("--cert-file", type=Path)
    group.add_argument("--key-file", type=Path)
    group.add_argument(
        "--listen", type=float, default=2.0, metavar="SECONDS", help="longest time to collect devices' retained state"
    )


def _broker_settings(args: argparse.Namespace) -> MqttSection:
    from pydantic import ValidationError

    from agent.config.models import MqttSection
    from agent.errors import validation_problems

    raw: dict[str, Any] = {"broker": args.broker, "topic_root": args.topic_root, "username": args.username}
    if args.password_env or args.password_file:
        raw["password"] = {"env": args.password_env} if args.password_env else {"file": args.password_file}
    if args.ca_file or args.cert_file or args.key_file:
        raw["tls"] = {"ca_file": args.ca_file, "cert_file": args.cert_file, "key_file": args.key_file}
    try:
        return MqttSection.model_validate(raw)
    except ValidationError as exc:
        raise CliError("; ".join(validation_problems(exc))) from exc


# -- fleet --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from agent.fleet.client import FleetError, connect
    from agent.mqtt.protocol import ProtocolError, Topics

    if args.fleet_command == "acl":
        return _fleet_acl(args)
    if args.fleet_command == "enrol" and args.enrol_command == "policy":
        return write_policy(args)
    actions = {
        "push": _fleet_push,
        "status": _fleet_status,
        "rollback": _fleet_rollback,
        "gc": _fleet_gc,
        "snapshot": _fleet_snapshot,
        "media": _fleet_media,
        "samples": fleet_samples,
        "camera-reference": _fleet_camera_reference,
        "release": _fleet_release,
        "rollout": fleet_rollout,
        "enrol": fleet_enrol,
        "retire": fleet_retire,
    }
    settings = _broker_settings(args)
    topics = Topics(settings.topic_root)
    try:
        _check_before_connecting(args, topics)
        link = connect(settings)
        try:
            if args.fleet_command in SENDS_CONTROL:
                _say_too_old(args, link, topics)
            return actions[args.fleet_command](args, link, topics)
        finally:
            link.stop()
    except (FleetError, ProtocolError) as exc:
        raise CliError(str(exc)) from exc


#: the fleet actions that send devices a control document (a desired document, a release, a command)
SENDS_CONTROL = ("push", "rollback", "snapshot", "media", "release")


def _say_too_old(args: argparse.Namespace, link: MqttLink, topics: Topics) -> None:
    """Name each target whose status says it reads an older protocol than the documents this
    CLI writes (docs/fleet.md#protocol-versions); a single device that is too old is refused
    with nothing sent, a group's are named and the rest still get it. Every agent reads
    protocol 1, so while this CLI writes protocol 1 nothing is asked of the broker."""
    from agent.fleet.state import fleet_state
    from agent.fleet.versions import too_old
    from agent.mqtt.device_documents import StatusDocument
    from agent.mqtt.protocol import written_protocol

    needed = written_protocol()
    if needed is None:
        return
    target = args.target if getattr(args, "target", None) else f"device:{args.device}"
    kind, _, name = target.partition(":")
    statuses = {
        device: parts.status
        for device, parts in fleet_state(link, topics, args.listen).items()
        if isinstance(parts.status, StatusDocument) and (device == name if kind == "device" else parts.group == name)
    }
    old = too_old(statuses, needed)
    for why in old.values():
        print(f"edge-agent: {why}", file=sys.stderr)
    if kind == "device" and old:
        raise CliError(f"nothing sent to {name}: it is too old for a protocol {needed} document")


def _check_before_connecting(args: argparse.Namespace, topics: Topics) -> None:
    """Mistakes in the arguments are reported before any broker is contacted."""
    from agent.fleet.push import bundle_manifest

    if getattr(args, "target", None):
        topics.target_desired(args.target)  # raises ProtocolError for anything but device:ID / group:NAME
    if args.fleet_command == "push":
        if not args.bundle.is_file():
            raise CliError(f"bundle file not found: {args.bundle}")
        bundle_manifest(args.bundle, args.agent)  # BundleError for a file that is not a bundle of that kind
        args.staging = staging(args)  # raises CliError for a bad schedule or a target that is no group
        args.shadow_request, args.quality_request = quality_requests(args)
        if args.agent and (args.shadow_request is not None or args.quality_request is not None):
            raise CliError("an agent bundle has no shadow or quality check: those judge a model")
        if args.deployment_id is not None and not 1 <= len(args.deployment_id) <= 200:
            raise CliError(f"--id must be 1 to 200 characters, not {len(args.deployment_id)}")
    if args.fleet_command in ("snapshot", "release") and not args.target.startswith("device:"):
        raise CliError(f"{args.fleet_command} needs --target device:ID, not {args.target!r}")
    if args.fleet_command == "samples":
        check_samples_arguments(args)
    if hasattr(args, "key"):
        args.signing_key = _operator_key(args.key)


def _operator_key(path: Path | None) -> Any:
    """The operator's private key, or None (with a warning: unsigned control)."""
    from agent.bundles.signing import load_private_key

    if path is None:
        print(
            "edge-agent: warning: no --key: this is unsigned, and only devices with allow_unsigned_control obey it",
            file=sys.stderr,
        )
        return None
    return load_private_key(Path(path))


def _fleet_push(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from tqdm import tqdm

    from agent.fleet.push import push

    with tqdm(
        total=args.bundle.stat().st_size, unit="B", unit_scale=True, desc="push", disable=not sys.stderr.isatty()
    ) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        desired = push(
            link,
            topics,
            args.bundle,
            args.target,
            chunk_size=args.chunk_size,
            url=args.url,
            key=args.signing_key,
            allow_downgrade=args.allow_downgrade,
            staging=args.staging,
            deployment_id=args.deployment_id,
            shadow=args.shadow_request,
            quality=args.quality_request,
            progress=progress,
            notice=lambda text: print(f"edge-agent: {text}", file=sys.stderr),
            agent=args.agent,
        )
    print(
        f"pushed {desired.name} {desired.version} ({desired.size} bytes, {desired.chunks} chunks, "
        f"sha256 {desired.sha256[:12]}) to {args.target} as deployment {desired.id}"
    )
    if desired.rollout is not None:
        waves = ",".join(f"{w:g}%" for w in desired.rollout.waves)
        print(
            f"staged rollout: waves {waves}, one every {desired.rollout.interval_s:g} s, halts past "
            f"{desired.rollout.max_failures} failed; `edge-agent fleet rollout status {desired.id}`"
        )
        return follow_rollout(args, link, topics, desired.id, args.wait) if args.wait > 0 else 0
    return _follow(args, link, topics, desired.id) if args.wait > 0 else 0


def _follow(args: argparse.Namespace, link: MqttLink, topics: Topics, deployment_id: str) -> int:
    from agent.fleet.client import FleetError
    from agent.fleet.push import follow
    from agent.fleet.state import targets
    from agent.mqtt.device_documents import Unreadable

    try:
        devices = targets(link, topics, args.target, args.listen)
    except FleetError as exc:
        print(f"{exc}; its devices install the bundle when they connect")
        return 0
    failed = 0
    for device, record in follow(link, topics, devices, deployment_id, args.wait).items():
        if record is not None and not isinstance(record, Unreadable) and record.state == "SUCCEEDED":
            print(f"{device}: SUCCEEDED")
            continue
        failed += 1
        if record is None:
            print(f"{device}: no answer within {args.wait:.0f} s (offline? it installs the bundle when it connects)")
        elif isinstance(record, Unreadable):
            print(f"{device}: its deployment record cannot be read: {record.problem}")
        elif record.error:
            print(f"{device}: {record.state} {record.error}")
        else:
            print(f"{device}: still {record.state} after {args.wait:.0f} s")
    return 1 if failed else 0


def _fleet_status(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.state import fleet_state, group_rollouts, status_rows

    devices = fleet_state(link, topics, args.listen)
    for unreadable in (u for parts in devices.values() for u in parts.unreadable):
        print(f"edge-agent: unreadable document on {unreadable}", file=sys.stderr)
    if args.version_filter is not None:
        devices = _by_version(devices, args.version_filter)
    if args.json:  # each document as read (unreadable ones are left out, named above)
        documents = {
            device: {
                leaf: d.model_dump(mode="json", by_alias=True, exclude_unset=True)
                for leaf, d in parts.documents().items()
            }
            for device, parts in devices.items()
        }
        print(json.dumps({device: found for device, found in documents.items() if found}, indent=2))
        return 0
    rows = status_rows(devices, group_rollouts(link, topics, args.listen))
    if not rows:
        print(f"no device has reported on {args.broker} under {topics.root}/")
        return 0
    columns = ("device", "state", "group", "bundle", "deployment", "quality", "wave", "fps", "temperature_c", "version")
    cells = [[("-" if (value := getattr(row, c)) is None else str(value)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return 0


def _by_version(devices: dict[str, DeviceReports], spec: VersionSpec) -> dict[str, DeviceReports]:
    """The devices whose status names a version `spec` matches; those of unknown version are
    left out and named on stderr."""
    from agent.mqtt.device_documents import StatusDocument

    def version(parts: DeviceReports) -> str | None:
        return parts.status.agent_version if isinstance(parts.status, StatusDocument) else None

    unknown = sorted(device for device, parts in devices.items() if version(parts) is None)
    if unknown:
        print(
            f"edge-agent: left out {len(unknown)} device(s) of unknown version (no readable status, or an agent "
            f"before 0.2.0 that is offline): {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}",
            file=sys.stderr,
        )
    return {device: parts for device, parts in devices.items() if spec.matches(version(parts))}


def _fleet_rollback(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.client import command
    from agent.fleet.state import targets

    devices = targets(link, topics, args.target, args.listen)
    answers = command(link, topics, devices, "rollback", key=args.signing_key, timeout=args.timeout)
    failed = 0
    for device, answer in answers.items():
        if answer is None:
            failed += 1
            print(f"{device}: no answer within {args.timeout:.0f} s (offline?)")
            continue
        body = json.loads(answer[0])
        if body.get("ok"):
            result = body["result"]
            print(f"{device}: rolled back to {result.get('name')} {result.get('version')}")
        else:
            failed += 1
            print(f"{device}: {body['error']['code']}: {body['error']['message']}")
    return 1 if failed else 0


def _fleet_gc(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.gc import clear_bundle, clear_topics, unreferenced_bundles

    found = unreferenced_bundles(link, topics, args.listen, args.min_age)
    verb = "would remove" if args.dry_run else "removed"
    for sha, index in found.unreferenced.items():
        if not args.dry_run:
            clear_bundle(link, topics, index)
        print(f"{verb} bundle {sha[:12]} ({index.size} bytes, {len(index.chunks)} chunks)")
    if found.strays:
        if not args.dry_run:
            clear_topics(link, found.strays)
        print(f"{verb} {len(found.strays)} stray chunk(s) beyond their bundle's index: {', '.join(found.strays[:3])}")
    if found.orphans:
        print(f"kept {len(found.orphans)} chunk(s) of bundles without an index (a push in progress?)")
    if not found.unreferenced and not found.strays:
        print("every bundle on the broker is referenced by a desired document")
    return 0


def _fleet_snapshot(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    arguments = {"camera": args.camera} if args.camera else {}
    return _save_jpeg(args, link, topics, args.target.partition(":")[2], "snapshot", arguments, args.out)


def _fleet_media(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    if args.clip:
        from agent.fleet.client import fetch_clip

        out = args.out or Path(f"{args.event}.mp4")
        clip = fetch_clip(link, topics, args.device, args.event, args.signing_key, args.timeout, args.chunk_size)
        out.write_bytes(clip)
        print(f"wrote {out} ({len(clip)} bytes) from {args.device}")
        return 0
    out = args.out or Path(f"{args.event}.jpg")
    return _save_jpeg(args, link, topics, args.device, "media", {"event": args.event}, out)


def _fleet_camera_reference(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.client import command

    arguments = {"camera": args.camera}
    answer = command(link, topics, [args.device], "camera-reference", arguments, args.signing_key, args.timeout)
    found = answer[args.device]
    if found is None:
        raise CliError(f"{args.device} did not answer within {args.timeout:.0f} s (offline?)")
    body = json.loads(found[0])
    if not body.get("ok"):
        raise CliError(f"{args.device}: {body['error']['code']}: {body['error']['message']}")
    print(f"{args.device}: camera {args.camera}'s next frame becomes its reference view ('moved' clears)")
    return 0


def _save_jpeg(
    args: argparse.Namespace,
    link: MqttLink,
    topics: Topics,
    device: str,
    name: str,
    arguments: dict[str, Any],
    out: Path,
) -> int:
    """Ask `device` for a JPEG by the command `name` and write it to `out`."""
    from agent.fleet.client import command

    answer = command(link, topics, [device], name, arguments, args.signing_key, args.timeout)[device]
    if answer is None:
        raise CliError(f"{device} did not answer within {args.timeout:.0f} s (offline?)")
    body, content_type = answer
    if content_type != "image/jpeg":
        error = json.loads(body)["error"]
        raise CliError(f"{device}: {error['code']}: {error['message']}")
    out.write_bytes(body)
    print(f"wrote {out} ({len(body)} bytes) from {device}")
    return 0


def _fleet_release(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.push import release

    device = args.target.partition(":")[2]
    document = release(link, topics, device, args.signing_key)
    print(f"released {device} to its group's desired document ({document.id})")
    return 0


def _fleet_acl(args: argparse.Namespace) -> int:
    from agent.fleet.acl import mosquitto_acl, parse_devices
    from agent.mqtt.protocol import Topics

    lines = list(args.device)
    if args.devices_file is not None:
        try:
            lines += args.devices_file.read_text().splitlines()
        except OSError as exc:
            raise CliError(f"cannot read {args.devices_file}: {exc.strerror}") from exc
    try:
        devices = parse_devices(lines)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if not devices:
        raise CliError("name the devices: --device ID[:GROUP] (repeatable) or --devices-file FILE")
    prefix = args.home_assistant
    if prefix is not None and (not prefix or any(c in prefix for c in "#+ \t\n")):
        raise CliError(f"--home-assistant {prefix!r}: a discovery prefix without wildcards or spaces")
    if args.home_assistant_user and prefix is None:
        raise CliError("--home-assistant-user needs --home-assistant [PREFIX]")
    text = mosquitto_acl(devices, args.operator, Topics(args.topic_root), prefix, args.home_assistant_user)
    print(text, end="")
    return 0

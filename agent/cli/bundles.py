"""`edge-agent` commands for bundles on a device and at the operator: keygen, bundle
build/inspect/verify, install, rollback, status (see docs/bundles.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.bundles.record import State
from agent.cli.errors import CliError
from agent.cli.optimising import add_optimise_arguments, agreement_table, image_files, prepare_models
from agent.paths import DEFAULT_STATE_DIR
from pipelines.decoders import DECODER_CHOICES

if TYPE_CHECKING:
    from agent.config.models import AgentConfig
    from runtimes.engine_cache import EngineKey


def add_bundle_commands(commands: Any) -> None:
    """Add keygen, bundle, install, rollback and status to the `edge-agent` subparsers."""
    keygen = commands.add_parser("keygen", help="create an Ed25519 signing key pair for bundles")
    keygen.add_argument("--out", type=Path, required=True, help="folder for signing.key (0600) and signing.pub")

    bundle = commands.add_parser("bundle", help="build, inspect and verify model bundles")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    build = bundle_commands.add_parser("build", help="write a bundle from models")
    build.add_argument("--model", type=Path, action="append", required=True, help=".onnx or .tflite (repeatable)")
    build.add_argument("--labels", type=Path, help="labels file (default: the model's metadata)")
    build.add_argument(
        "--decoder",
        choices=DECODER_CHOICES,
        default="auto",
        help="output decoder (default auto: from the outputs and the model's metadata; docs/models.md lists exports)",
    )
    build.add_argument("--name", help="bundle name (default: the first model's file name)")
    build.add_argument("--version", default="0.1.0", help="semantic version (default 0.1.0)")
    build.add_argument("--description", default="")
    build.add_argument("--calibration", type=Path, help="folder of calibration images (.jpg/.png)")
    build.add_argument("--key", type=Path, help="signing.key to sign the manifest with")
    build.add_argument(
        "--engine",
        type=Path,
        action="append",
        default=[],
        help="a prebuilt TensorRT engine from `edge-agent engine build --out` (its tags in ENGINE.json; repeatable)",
    )
    build.add_argument("-o", "--out", type=Path, required=True, help="bundle file to write")
    add_optimise_arguments(build)
    inspect = bundle_commands.add_parser("inspect", help="print a bundle's manifest summary")
    inspect.add_argument("bundle", type=Path)
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    verify = bundle_commands.add_parser("verify", help="check a bundle completely without installing it")
    verify.add_argument("bundle", type=Path)
    _trust_arguments(verify)

    install = commands.add_parser("install", help="install and activate a bundle on this device")
    install.add_argument("bundle", type=Path)
    install.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="install even if a higher version of this bundle succeeded here (refused otherwise)",
    )
    _trust_arguments(install)
    _state_arguments(install)
    rollback = commands.add_parser("rollback", help="return to the previous version")
    _state_arguments(rollback)
    status = commands.add_parser("status", help="current and previous versions, last deployment")
    _state_arguments(status)
    status.add_argument("--json", action="store_true")


def _trust_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-key", type=Path, action="append", default=[], help="trusted signing.pub (repeatable)")
    parser.add_argument("--allow-unsigned", action="store_true", help="accept bundles without a valid signature")
    parser.add_argument("--config", type=Path, help="device config (YAML): state_dir, trust_keys, limits, ...")


def _state_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, help=f"state directory (default: the config's, else {DEFAULT_STATE_DIR})"
    )
    if not any(a.dest == "config" for a in parser._actions):
        parser.add_argument("--config", type=Path, help="device config (YAML)")


def _device_config(args: argparse.Namespace) -> AgentConfig:
    from agent.config.loading import load_config
    from agent.config.models import AgentConfig

    config = load_config(args.config) if getattr(args, "config", None) else AgentConfig()
    updates: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        updates["state_dir"] = args.state_dir
    if getattr(args, "trust_key", None):
        updates["trust_keys"] = [*config.trust_keys, *args.trust_key]
    if getattr(args, "allow_unsigned", False):
        updates["allow_unsigned"] = True
    return config.model_copy(update=updates)


def cmd_keygen(args: argparse.Namespace) -> int:
    from agent.bundles.signing import generate_keypair, key_id, load_public_key

    try:
        private, public = generate_keypair(args.out)
    except (FileExistsError, OSError) as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {private} (keep it secret) and {public} (key id {key_id(load_public_key(public))})")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    return {"build": _bundle_build, "inspect": _bundle_inspect, "verify": _bundle_verify}[args.bundle_command](args)


def _bundle_build(args: argparse.Namespace) -> int:
    import tempfile

    from agent.bundles.archive import build_bundle
    from agent.bundles.signing import load_private_key
    from pipelines.labels import Labels

    for model in args.model:
        if not model.is_file():
            raise CliError(f"model file not found: {model}")
    labels = None
    if args.labels:
        parsed = Labels.from_file(args.labels)
        labels = [parsed(i) for i in range(max(parsed.names) + 1)] if parsed.names else None
    calibration = image_files(args.calibration, "calibration") if args.calibration else []
    key = load_private_key(args.key) if args.key else None
    engines = [_engine_file(path) for path in args.engine]
    with tempfile.TemporaryDirectory(prefix="edge-agent-build-") as workdir:
        models, notes = prepare_models(args, calibration, Path(workdir))
        manifest = build_bundle(
            models,
            args.out,
            name=args.name or args.model[0].stem,
            version=args.version,
            labels=labels,
            decoder=args.decoder,
            calibration=calibration,
            key=key,
            description=args.description,
            notes=notes,
            engines=engines,
        )
    signed = "signed" if key else "unsigned"
    print(f"wrote {args.out}: {manifest.name} {manifest.version}, {len(manifest.artifacts)} artifact(s), {signed}")
    return 0


def _engine_file(path: Path) -> tuple[Path, EngineKey]:
    """A prebuilt engine and the key in its tags file (``ENGINE.json``)."""
    from runtimes.engine_cache import EngineRecord

    tags = Path(f"{path}.json")
    if not path.is_file() or not tags.is_file():
        raise CliError(f"engine {path} and its tags {tags} are needed (edge-agent engine build --out writes both)")
    try:
        return path, EngineRecord.from_json(json.loads(tags.read_text())).key
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CliError(f"{tags}: not the tags of an engine ({exc})") from exc


@contextmanager
def _unpacked(bundle: Path) -> Iterator[Path]:
    import tempfile

    from agent.bundles.archive import Limits, unpack

    if not bundle.is_file():
        raise CliError(f"bundle not found: {bundle}")
    with tempfile.TemporaryDirectory(prefix="edge-agent-bundle-") as folder:
        unpack(bundle, Path(folder), Limits())
        yield Path(folder)


def _bundle_inspect(args: argparse.Namespace) -> int:
    from agent.bundles.archive import read_manifest

    with _unpacked(args.bundle) as folder:
        _, manifest = read_manifest(folder)
        signed = (folder / "manifest.sig").is_file()
    if args.json:
        print(json.dumps(manifest.model_dump(mode="json")))
        return 0
    print(f"{manifest.name} {manifest.version} ({manifest.task}, decoder {manifest.decoder}), built {manifest.created}")
    print(f"  signed: {'yes' if signed else 'no'}")
    h, w = manifest.input.size
    print(f"  input: {w}x{h} {manifest.input.color}, {manifest.input.resize}")
    more = ", ..." if len(manifest.labels) > 5 else ""
    print(f"  labels: {len(manifest.labels)} ({', '.join(manifest.labels[:5])}{more})")
    for a in manifest.artifacts:
        print(f"  artifact {a.path}: {a.format} {a.precision}, {a.size} bytes, sha256 {a.sha256[:16]}...")
    for line in agreement_table(manifest):
        print(line)
    return 0


def _bundle_verify(args: argparse.Namespace) -> int:
    from agent.bundles.archive import verify_unpacked
    from agent.bundles.signing import load_public_key

    config = _device_config(args)
    trusted = [load_public_key(p) for p in config.trust_keys]
    with _unpacked(args.bundle) as folder:
        verified = verify_unpacked(folder, trusted, config.allow_unsigned)
    signer = f"signed by key {verified.signer}" if verified.signer else "UNSIGNED (allowed by --allow-unsigned)"
    print(f"{args.bundle}: OK, {verified.manifest.name} {verified.manifest.version}, {signer}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from agent.bundles.install import InstallPolicy, install
    from agent.bundles.store import Store
    from agent.hardware.probe import probe

    config = _device_config(args)
    if not args.bundle.is_file():
        raise CliError(f"bundle not found: {args.bundle}")
    store = Store(config.state_dir, keep=config.keep_versions)
    deployment = install(
        args.bundle,
        store,
        probe(),
        InstallPolicy.from_config(config),
        on_state=lambda d: print(d.state, flush=True),
        allow_downgrade=args.allow_downgrade,
    )
    if deployment.state != State.SUCCEEDED:
        error = deployment.error or {}
        raise CliError(f"{deployment.state}: {error.get('code')}: {error.get('message')}")
    print(f"installed {deployment.name} {deployment.version} ({deployment.sha256[:12]}); it is now current")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from agent.bundles.install import rollback
    from agent.bundles.store import Store

    config = _device_config(args)
    try:
        deployment = rollback(Store(config.state_dir, keep=config.keep_versions))
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    print(f"rolled back to {deployment.name} {deployment.version} ({deployment.sha256[:12]})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from agent.bundles.store import Store

    config = _device_config(args)
    store = Store(config.state_dir, keep=config.keep_versions)
    store.recover()

    def version(sha: str | None) -> dict[str, str] | None:
        info = store.info(sha)
        return {"name": info.name, "version": info.version, "sha256": info.sha256} if info else None

    deployment = store.last_deployment()
    report = {
        "current": version(store.current_sha()),
        "previous": version(store.previous_sha()),
        "deployment": {"state": deployment.state, "error": deployment.error} if deployment else None,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for key, sha in (("current", store.current_sha()), ("previous", store.previous_sha())):
        info = store.info(sha)
        print(f"{key + ':':<10} " + (f"{info.name} {info.version} ({info.sha256[:12]})" if info else "none"))
    if deployment:
        error = f" {deployment.error['code']}: {deployment.error['message']}" if deployment.error else ""
        print(f"{'last:':<10} {deployment.id} {deployment.state}{error}")
    return 0


BUNDLE_COMMANDS = {
    "keygen": cmd_keygen,
    "bundle": cmd_bundle,
    "install": cmd_install,
    "rollback": cmd_rollback,
    "status": cmd_status,
}

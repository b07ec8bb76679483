"""Loading ``agent.yaml``: YAML into `AgentConfig`, every problem reported with its file and line.

`load_config` raises `ConfigError` listing every problem; `check_config` returns them (for
``edge-agent config check``), adding what the validators cannot see because it needs I/O:
files and environment variables the config names but this machine lacks.

Bounded before it is parsed (a SIGHUP must never end the daemon, docs/configuration.md): at most
`MAX_CONFIG_BYTES` + 1 bytes are read, so a file past the bound (one linked to /dev/zero) is
refused without being read to its end; then a scan of the YAML events (a loop, not recursion:
libyaml's when PyYAML has it) refuses collections nested deeper than `MAX_CONFIG_DEPTH` and more
than `MAX_CONFIG_NODES` keys, values and list items, an alias counted as the nodes it repeats
(a billion laughs), before anything is composed or validated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from agent.config.models import AgentConfig
from agent.errors import ConfigError
from pipelines.sources.specs import source_kind
from runtimes.registry import load_plugins

#: the largest config file read (1 MiB); a real one is a few KiB
MAX_CONFIG_BYTES = 1 << 20
#: collections nested in one another, the top-level mapping counted; a real config has at most 8
#: (cameras, a camera, its zones, a zone, its polygon, a point)
MAX_CONFIG_DEPTH = 32
#: keys, values and list items, each alias counted as what it repeats; a real config has hundreds
MAX_CONFIG_NODES = 20_000


def _read(path: Path) -> str:
    """The text of the config at `path`, read up to the bound; `ConfigError` when it is larger,
    `OSError` when it cannot be read, `UnicodeDecodeError` when it is not UTF-8."""
    with path.open("rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than the {MAX_CONFIG_BYTES} bytes (1 MiB) a config may be; not read further")
    return data.decode("utf-8")


def _shape_problem(text: str) -> tuple[int, str] | None:
    """The line and words of the first bound `text` passes (nesting, nodes), None within them.
    Scans YAML events without building anything, with libyaml when PyYAML has it and PyYAML's
    own parser when libyaml refuses the text (it gives up past 1000 levels of flow nesting on its
    own, looking ahead); a syntax error ends the scan, and the loader reports it."""
    scanners = dict.fromkeys((getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader))
    for scanner in scanners:
        try:
            return _scan(yaml.parse(text, Loader=scanner))
        except yaml.YAMLError:
            continue
    return None


def _line(event: yaml.Event) -> int:
    return event.start_mark.line + 1 if event.start_mark is not None else 1


def _scan(events: Iterable[yaml.Event]) -> tuple[int, str] | None:
    open_collections: list[tuple[str | None, int]] = []  # each open one's anchor and the node count it began at
    repeats: dict[str, int] = {}  # the nodes each anchor's node holds, itself included
    nodes = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_collections) >= MAX_CONFIG_DEPTH:
                words = (
                    f"nested deeper than {MAX_CONFIG_DEPTH} levels, deeper than any setting goes; not parsed further"
                )
                return _line(event), words
            open_collections.append((event.anchor, nodes))
            nodes += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, began = open_collections.pop()
            if anchor is not None:
                repeats[anchor] = nodes - began
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if event.anchor is not None:
                repeats[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent) and event.anchor is not None:
            nodes += repeats.get(event.anchor, 1)  # an anchor still open (an alias inside itself) counts once
        if nodes > MAX_CONFIG_NODES:
            return _line(event), (
                f"more than {MAX_CONFIG_NODES} keys, values and list items (an alias counts as what it repeats), "
                "more than any config needs; not parsed further"
            )
    return None


def _bounded_text(path: Path) -> str:
    """The config's text once it is within every bound; `ConfigError` naming the bound passed."""
    text = _read(path)
    problem = _shape_problem(text)
    if problem is not None:
        line, words = problem
        raise ConfigError(f"{path}:{line}: {words}")
    return text


def _new_name(key: str, value: yaml.Node) -> str:
    """The name a top-level key of its old form is validated under (`AgentConfig`'s
    ``_old_names``): a ``pipelines:`` list is ``cameras:``, a ``cameras:`` mapping ``serving:``."""
    if key == "pipelines":
        return "cameras"
    return "serving" if key == "cameras" and isinstance(value, yaml.MappingNode) else key


def _yaml_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line number (1-based) of every mapping key and sequence item, by its location (a top-level
    key in its old form by its new name, as the problems name it)."""
    lines: dict[tuple[str, ...], int] = {}
    seen: set[int] = set()  # an alias may point back at its own anchor

    def walk(node: yaml.Node, loc: tuple[str, ...]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                where = (*loc, _new_name(str(key.value), value) if not loc else str(key.value))
                lines[where] = key.start_mark.line + 1
                walk(value, where)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*loc, str(i)))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


@dataclass(frozen=True)
class ConfigLines:
    """Where the keys and list items of a config file are (`read` it once, after loading), so
    that a problem found later (a class name the serving version lacks) names its line."""

    path: Path | None = None
    lines: Mapping[tuple[str, ...], int] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path | None) -> ConfigLines:
        """The lines of the file at `path` (none known when it cannot be read, or without a path)."""
        if path is None:
            return cls()
        try:
            return cls(path, _yaml_lines(_bounded_text(path)))
        except (ConfigError, OSError, UnicodeDecodeError):
            return cls(path)

    def where(self, loc: Sequence[str]) -> str:
        """``FILE:LINE: a.b.c`` for the key path `loc` (the line of the nearest key above it that
        the file has), ``FILE: a.b.c`` when no line is known, ``a.b.c`` without a file."""
        key = tuple(loc)
        line = next((self.lines[key[:n]] for n in range(len(key), -1, -1) if key[:n] in self.lines), None)
        dotted = ".".join(key) or "(top)"
        if self.path is None:
            return dotted
        return f"{self.path}:{line}: {dotted}" if line else f"{self.path}: {dotted}"


def _parse(path: Path) -> tuple[AgentConfig | None, list[str]]:
    try:
        text = _bounded_text(path)
    except ConfigError as exc:
        return None, [str(exc)]
    except OSError as exc:
        return None, [f"{path}: cannot read: {exc.strerror}"]
    except UnicodeDecodeError as exc:
        return None, [f"{path}: not UTF-8 text: {exc}"]
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, [f"{path}: not valid YAML: {exc}"]
    if raw is not None and not isinstance(raw, dict):
        return None, [f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}"]
    load_plugins()  # a plugin's section and name validate once it is loaded (validators do no I/O)
    try:
        return AgentConfig.model_validate(raw or {}), []
    except RecursionError:
        return None, [f"{path}: not valid: a YAML alias contains itself (e.g. `a: &a [*a]`), which no setting can be"]
    except ValidationError as exc:
        lines = ConfigLines(path, _yaml_lines(text))
        return None, [f"{lines.where([str(p) for p in error['loc']])}: {error['msg']}" for error in exc.errors()]


def load_config(path: Path) -> AgentConfig:
    """Load agent.yaml; raises `ConfigError` listing every problem with its file, line and key."""
    config, problems = _parse(path)
    if config is None:
        raise ConfigError("; ".join(problems))
    return config


def check_files(config: AgentConfig) -> list[str]:
    """Files and variables the config names but this machine lacks (the I/O validators skip)."""
    problems = []
    named: list[tuple[str, Path | None]] = [(f"trust_keys.{i}", key) for i, key in enumerate(config.trust_keys)]
    mqtt = config.mqtt
    if mqtt is not None:
        if mqtt.tls is not None:
            named += [(f"mqtt.tls.{k}", getattr(mqtt.tls, k)) for k in ("ca_file", "cert_file", "key_file")]
        if mqtt.password is not None:
            named.append(("mqtt.password.file", mqtt.password.file))
            if mqtt.password.env is not None and mqtt.password.env not in os.environ:
                problems.append(f"mqtt.password.env: the environment variable {mqtt.password.env} is not set")
    if mqtt is None and config.enrolment.claim is not None:  # enrolled, the claim is no longer read
        named.append(("enrolment.claim", config.enrolment.claim))
    page = config.status_page
    if page is not None:
        named.append(("status_page.password_file", page.password_file))
        if page.tls is not None:
            named += [(f"status_page.tls.{k}", getattr(page.tls, k)) for k in ("cert_file", "key_file")]
        if page.password_env is not None and page.password_env not in os.environ:
            problems.append(f"status_page.password_env: the environment variable {page.password_env} is not set")
    for where, path in named:
        if path is not None and not path.is_file():
            problems.append(f"{where}: no such file {path}")
    for i, camera in enumerate(config.cameras):
        if source_kind(camera.source) == "file" and not Path(camera.source).is_file():
            problems.append(f"cameras.{i}.source: no such video file {camera.source}")
    operator_keys = [(f"operator_keys.{i}", key) for i, key in enumerate(config.operator_keys)]
    problems += [f"{where}: no such file {path}" for where, path in operator_keys if not path.is_file()]
    if not config.trust_keys and not config.allow_unsigned:
        problems.append("trust_keys: empty and allow_unsigned is false, so every bundle will be refused")
    if config.mqtt is not None and not config.operator_keys and not config.allow_unsigned_control:
        problems.append(
            "operator_keys: empty and allow_unsigned_control is false, so every desired document and command "
            "will be refused (add the operators' public keys: edge-agent keygen makes them)"
        )
    return problems


def security_warnings(config: AgentConfig) -> list[str]:
    """What the config allows that an attacker on the broker or with a forged bundle could use;
    `config check` prints them and the agent logs them and shows them in its status."""
    warnings = []
    if config.allow_unsigned_control and config.mqtt is not None:
        warnings.append(
            "allow_unsigned_control is true: anyone who can publish to the broker can deploy, roll back and "
            "read camera frames on this device"
        )
    if config.allow_unsigned:
        warnings.append("allow_unsigned is true: this device installs bundles nobody signed")
    return warnings


def config_warnings(config: AgentConfig) -> list[str]:
    """What the agent logs at start, shows in its status and `config check` prints: the
    deprecated forms the config uses (each with its new form), then its `security_warnings`."""
    return [*config.deprecations, *security_warnings(config)]


def check_config(path: Path) -> list[str]:
    """Every problem with the config at `path`: parse and value errors with their line, then files."""
    return check(path)[0]


def check(path: Path) -> tuple[list[str], list[str]]:
    """The problems of the config at `path` (as `check_config`) and its warnings (`config_warnings`)."""
    config, problems = _parse(path)
    if config is None:
        return problems, []
    return check_files(config), config_warnings(config)


def schema_json() -> str:
    return json.dumps(AgentConfig.model_json_schema(), indent=2) + "\n"

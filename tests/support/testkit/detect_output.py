"""`edge-agent detect --json`'s records checked against docs/detect-output.schema.json, with the
subset of JSON Schema that document uses (no jsonschema dependency)."""

from __future__ import annotations

import json
from typing import Any

from testkit import REPO

SCHEMA = json.loads((REPO / "docs" / "detect-output.schema.json").read_text())


def check_detect_output(record: Any) -> None:
    """`record` (one line of ``detect --json``, parsed) fits the schema; AssertionError naming where not."""
    _check(record, SCHEMA)


def _check(value: Any, schema: dict[str, Any], where: str = "$") -> None:
    """The subset of JSON Schema the document uses: $ref, oneOf, anyOf, const, type, required,
    properties, items, minItems / maxItems, minimum / maximum."""
    if "$ref" in schema:
        _check(value, SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]], where)
        return
    if "oneOf" in schema:
        fits = _fits(value, schema["oneOf"], where)
        assert fits == 1, f"{where}: fits {fits} of the oneOf options"
        return
    if "anyOf" in schema:
        assert _fits(value, schema["anyOf"], where) >= 1, f"{where}: fits none of the anyOf options"
    if "const" in schema:
        assert value == schema["const"], where
    kinds = schema.get("type")
    if kinds is not None:
        names = {
            "object": dict,
            "array": list,
            "string": str,
            "integer": int,
            "number": (int, float),
            "null": type(None),
            "boolean": bool,
        }
        wanted = kinds if isinstance(kinds, list) else [kinds]
        assert any(isinstance(value, names[k]) and (k == "boolean" or not isinstance(value, bool)) for k in wanted), (
            f"{where}: {value!r}"
        )
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{where}: no {key}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                _check(value[key], sub, f"{where}.{key}")
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), where
        assert len(value) <= schema.get("maxItems", len(value)), where
        for i, item in enumerate(value):
            if "items" in schema:
                _check(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert value >= schema.get("minimum", value) and value <= schema.get("maximum", value), where


def _fits(value: Any, options: list[dict[str, Any]], where: str) -> int:
    """How many of `options` (schemas) `value` fits."""
    fits = 0
    for option in options:
        try:
            _check(value, option, where)
            fits += 1
        except AssertionError:
            pass
    return fits

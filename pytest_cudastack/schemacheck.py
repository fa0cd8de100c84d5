"""The first place a JSON document departs from one of our shipped schemas (``pytest_cudastack/schemas/``).

jsonschema is a test dependency, not a run-time one, and a snapshot read back for ``cudastack diff`` or
``--cudastack-baseline`` must be checked field by field before any code indexes it. This module implements
exactly the keywords our schemas use (listed in ``KEYWORDS``) with draft 2020-12's meaning; a schema using
any other keyword is refused (``ValueError``) instead of being half checked, and tests/test_robust_snapshot.py
checks its verdicts against jsonschema's on mutated documents. The walk follows the schema, so its depth is
the schema's (bounded again by ``_MAX_DEPTH`` against a recursive ``$ref``), never the document's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["KEYWORDS", "first_error"]

# keywords that constrain (each implemented below) and those that only annotate
KEYWORDS = frozenset(
    {
        "type",
        "const",
        "enum",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "$ref",
        "pattern",
        "minimum",
        "anyOf",
    }
)
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples"})
_MAX_DEPTH = 64
_SHOWN = 60  # characters of a wrong value quoted in the message


def first_error(instance: Any, schema: Mapping[str, Any]) -> str | None:
    """``"$.wheels[0].cuda_major: expected integer, found string 'x'"`` for the first field of *instance*
    (a document from ``json.loads``) that *schema* rejects, in the schema's order; None when it is valid."""
    return _check(instance, schema, schema, "$", 0)


def _check(value: Any, node: Mapping[str, Any], root: Mapping[str, Any], where: str, depth: int) -> str | None:
    """The first complaint of ``node`` about ``value``: its references and alternatives, then its own
    keywords, then the members of an object or array."""
    if depth > _MAX_DEPTH:
        return f"{where}: nested too deeply"
    unknown = set(node) - KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} not supported by pytest_cudastack.schemacheck")
    error = _check_applicators(value, node, root, where, depth)
    if error is None:
        error = _check_value(value, node, where)
    if error is not None:
        return error
    if isinstance(value, dict):
        return _check_object(value, node, root, where, depth)
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            error = _check(item, node["items"], root, f"{where}[{i}]", depth + 1)
            if error is not None:
                return error
    return None


def _check_applicators(
    value: Any, node: Mapping[str, Any], root: Mapping[str, Any], where: str, depth: int
) -> str | None:
    """What ``$ref`` and ``anyOf`` say of ``value`` (anyOf: a complaint only when no alternative accepts it)."""
    if "$ref" in node:
        error = _check(value, _resolve(root, node["$ref"]), root, where, depth + 1)
        if error is not None:
            return error
    if "anyOf" in node:
        errors = [_check(value, sub, root, where, depth + 1) for sub in node["anyOf"]]
        if all(e is not None for e in errors):
            # none accepts it: the first alternative's complaint names the field (the others' are alternatives)
            return str(errors[0]) if len(errors) == 1 else f"{errors[0]} (nor any of {len(errors) - 1} other form(s))"
    return None


def _check_value(value: Any, node: Mapping[str, Any], where: str) -> str | None:
    """What ``type``, ``const``, ``enum``, ``pattern`` and ``minimum`` say of ``value`` itself."""
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_is_type(value, t) for t in types):
            return f"{where}: expected {' or '.join(types)}, found {_describe(value)}"
    if "const" in node and not _equal(value, node["const"]):
        return f"{where}: expected {_show(node['const'])}, found {_describe(value)}"
    if "enum" in node and not any(_equal(value, v) for v in node["enum"]):
        return f"{where}: expected one of {', '.join(_show(v) for v in node['enum'])}, found {_describe(value)}"
    if "pattern" in node and isinstance(value, str) and not re.search(node["pattern"], value):
        return f"{where}: {_show(value)} does not match {node['pattern']!r}"
    if "minimum" in node and _is_type(value, "number") and value < node["minimum"]:
        return f"{where}: {value!r} is less than the minimum {node['minimum']!r}"
    return None


def _check_object(
    value: dict[str, Any], node: Mapping[str, Any], root: Mapping[str, Any], where: str, depth: int
) -> str | None:
    for key in node.get("required", ()):
        if key not in value:
            return f"{_field(where, key)}: missing"
    properties: Mapping[str, Any] = node.get("properties", {})
    for key, sub in properties.items():
        if key in value:
            error = _check(value[key], sub, root, _field(where, key), depth + 1)
            if error is not None:
                return error
    extra = node.get("additionalProperties", True)
    for key in value:
        if key in properties:
            continue
        if extra is False:
            return f"{_field(where, key)}: not allowed here"
        if isinstance(extra, Mapping):
            error = _check(value[key], extra, root, _field(where, key), depth + 1)
            if error is not None:
                return error
    return None


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    """A local reference, ``#/$defs/name`` (the only kind our schemas use)."""
    if not ref.startswith("#/"):
        raise ValueError(f"schema reference {ref!r} not supported by pytest_cudastack.schemacheck")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    if not isinstance(node, Mapping):
        raise ValueError(f"schema reference {ref!r} is not a schema")
    return node


def _is_type(value: Any, name: str) -> bool:
    """JSON Schema's types: booleans are not numbers; 1.0 is an integer."""
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    if isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float))
    raise ValueError(f"schema type {name!r} not supported by pytest_cudastack.schemacheck")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{_show(key)}]"


def _describe(value: Any) -> str:
    for name in ("null", "boolean", "string", "integer", "number", "array", "object"):
        if _is_type(value, name):
            if name in ("array", "object"):
                return f"{name} of {len(value)}"
            return name if name == "null" else f"{name} {_show(value)}"
    return type(value).__name__  # pragma: no cover - json.loads makes nothing else


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."

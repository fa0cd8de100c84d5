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
from collections.abc import Callable, Mapping
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


# Where a value is: "$", or (where its container is, its key or index). Built as a tuple per member and
# spelled out (``$.wheels[0].name``) only in a complaint: formatting every member's path made the check
# of a large snapshot several times slower than parsing it.
Where = str | tuple[Any, str | int]


def first_error(instance: Any, schema: Mapping[str, Any]) -> str | None:
    """``"$.wheels[0].cuda_major: expected integer, found string 'x'"`` for the first field of *instance*
    (a document from ``json.loads``) that *schema* rejects, in the schema's order; None when it is valid."""
    _check_keywords(schema, 0)
    if _compile(schema, schema, 0, {})(instance):
        return None  # the common case: one pass of compiled checks, no path built, nothing to name
    return _check(instance, schema, schema, "$", 0)


Valid = Callable[[Any], bool]
# JSON types as the exact Python types json.loads makes (a subclass fails the fast pass: the walk decides)
_EXACT: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "string": (str,),
    "array": (list,),
    "object": (dict,),
    "integer": (int,),  # and an integral float, below
    "number": (int, float),
}


def _compile(node: Mapping[str, Any], root: Mapping[str, Any], depth: int, memo: dict[int, Valid]) -> Valid:
    """Whether a value is valid under *node*, as one function built once per schema node: the fast pass of
    :func:`first_error` (which walks again, naming the field, only when it says no). It may only be stricter
    than :func:`_check` (a "no" is confirmed by the walk), never more lenient."""
    if id(node) in memo:
        return memo[id(node)]
    cell: list[Valid] = []
    memo[id(node)] = lambda v: cell[0](v)  # a recursive $ref reaches the node being built
    if depth > _MAX_DEPTH:
        cell.append(lambda v: False)
        return cell[0]
    parts: list[Valid] = []
    if "$ref" in node:
        parts.append(_compile(_resolve(root, node["$ref"]), root, depth + 1, memo))
    if "anyOf" in node:
        alternatives = [_compile(sub, root, depth + 1, memo) for sub in node["anyOf"]]
        parts.append(lambda v: any(f(v) for f in alternatives))
    if any(k in node for k in ("type", "const", "enum", "pattern", "minimum")):
        parts.append(_compile_value(node))
    if "required" in node or "properties" in node or "additionalProperties" in node:
        parts.append(_compile_object(node, root, depth, memo))
    if "items" in node:
        parts.append(_compile_items(node["items"], root, depth, memo))
    cell.append(parts[0] if len(parts) == 1 else lambda v: all(f(v) for f in parts))
    return cell[0]


def _compile_value(node: Mapping[str, Any]) -> Valid:
    """``type`` (and ``pattern``, ``minimum``) as exact-type tests; ``const``/``enum`` by :func:`_value_error`."""
    if "const" in node or "enum" in node or "type" not in node:
        return lambda v: _value_error(v, node) is None
    names = node["type"] if isinstance(node["type"], list) else [node["type"]]
    exact = frozenset(t for n in names for t in _EXACT[n])
    integral = "integer" in names and "number" not in names
    search = re.compile(node["pattern"]).search if "pattern" in node else None
    minimum = node.get("minimum")

    def valid(v: Any) -> bool:
        t = type(v)
        if t not in exact and not (integral and t is float and v.is_integer()):
            return False
        if search is not None and t is str and search(v) is None:
            return False
        return minimum is None or t not in (int, float) or v >= minimum

    return valid


def _compile_object(node: Mapping[str, Any], root: Mapping[str, Any], depth: int, memo: dict[int, Valid]) -> Valid:
    required = tuple(node.get("required", ()))
    props = {k: _compile(sub, root, depth + 1, memo) for k, sub in node.get("properties", {}).items()}
    extra = node.get("additionalProperties", True)
    extra_fn = _compile(extra, root, depth + 1, memo) if isinstance(extra, Mapping) else None

    def valid(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        if not all(k in v for k in required):
            return False
        for k, item in v.items():
            fn = props.get(k)
            if fn is None:
                fn = extra_fn
                if fn is None:
                    if extra is False:
                        return False
                    continue
            if not fn(item):
                return False
        return True

    return valid


def _compile_items(node: Mapping[str, Any], root: Mapping[str, Any], depth: int, memo: dict[int, Valid]) -> Valid:
    """An array's members; a list of plain strings (``{"type": "string"}``, with a ``pattern``) is checked at
    C speed (``map``), the shape a hostile snapshot would repeat a million times."""
    if set(node) - _ANNOTATIONS <= {"type", "pattern"} and node.get("type") == "string":
        search = re.compile(node["pattern"]).search if "pattern" in node else None

        def strings(v: Any) -> bool:
            if not isinstance(v, list):
                return True
            if set(map(type, v)) - {str}:
                return False
            return search is None or all(map(search, v))

        return strings
    fn = _compile(node, root, depth + 1, memo)
    return lambda v: not isinstance(v, list) or all(map(fn, v))


def _check_keywords(node: Any, depth: int) -> None:
    """Refuse a schema using a keyword this module does not implement (checked once, before the walk)."""
    if not isinstance(node, Mapping) or depth > _MAX_DEPTH:
        return
    unknown = set(node) - KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} not supported by pytest_cudastack.schemacheck")
    subs = [node.get("items"), node.get("additionalProperties")]
    subs += list(node.get("properties", {}).values()) + list(node.get("$defs", {}).values())
    subs += list(node.get("anyOf", ()))
    for sub in subs:
        _check_keywords(sub, depth + 1)


def _spell(where: Where) -> str:
    """``$.wheels[0].name`` for a path of :data:`Where`."""
    parts: list[str] = []
    while isinstance(where, tuple):
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else _field("", key))
    return where + "".join(reversed(parts))


def _check(value: Any, node: Mapping[str, Any], root: Mapping[str, Any], where: Where, depth: int) -> str | None:
    """The first complaint of ``node`` about ``value``: its references and alternatives, then its own
    keywords, then the members of an object or array."""
    if depth > _MAX_DEPTH:
        return f"{_spell(where)}: nested too deeply"
    error = _check_applicators(value, node, root, where, depth)
    if error is None:
        error = _check_value(value, node, where)
    if error is not None:
        return error
    if isinstance(value, dict):
        return _check_object(value, node, root, where, depth)
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            error = _check(item, node["items"], root, (where, i), depth + 1)
            if error is not None:
                return error
    return None


def _check_applicators(
    value: Any, node: Mapping[str, Any], root: Mapping[str, Any], where: Where, depth: int
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


def _check_value(value: Any, node: Mapping[str, Any], at: Where) -> str | None:
    """What ``type``, ``const``, ``enum``, ``pattern`` and ``minimum`` say of ``value`` itself."""
    error = _value_error(value, node)
    return None if error is None else f"{_spell(at)}: {error}"


def _value_error(value: Any, node: Mapping[str, Any]) -> str | None:
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_is_type(value, t) for t in types):
            return f"expected {' or '.join(types)}, found {_describe(value)}"
    if "const" in node and not _equal(value, node["const"]):
        return f"expected {_show(node['const'])}, found {_describe(value)}"
    if "enum" in node and not any(_equal(value, v) for v in node["enum"]):
        return f"expected one of {', '.join(_show(v) for v in node['enum'])}, found {_describe(value)}"
    if "pattern" in node and isinstance(value, str) and not re.search(node["pattern"], value):
        return f"{_show(value)} does not match {node['pattern']!r}"
    if "minimum" in node and _is_type(value, "number") and value < node["minimum"]:
        return f"{value!r} is less than the minimum {node['minimum']!r}"
    return None


def _check_object(
    value: dict[str, Any], node: Mapping[str, Any], root: Mapping[str, Any], where: Where, depth: int
) -> str | None:
    for key in node.get("required", ()):
        if key not in value:
            return f"{_spell((where, key))}: missing"
    properties: Mapping[str, Any] = node.get("properties", {})
    for key, sub in properties.items():
        if key in value:
            error = _check(value[key], sub, root, (where, key), depth + 1)
            if error is not None:
                return error
    extra = node.get("additionalProperties", True)
    for key in value:
        if key in properties:
            continue
        if extra is False:
            return f"{_spell((where, key))}: not allowed here"
        if isinstance(extra, Mapping):
            error = _check(value[key], extra, root, (where, key), depth + 1)
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

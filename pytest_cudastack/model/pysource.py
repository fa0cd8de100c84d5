"""Python sources read statically: the imports a module's top-level code performs, in execution order.

Never runs or imports anything: a string-aware line scan keeps only the top-level statements the import model reads
(imports, ``if``/``try``/``with``/``class`` blocks and top-level calls), :mod:`ast` parses them, and ``if`` tests on
``TYPE_CHECKING``, ``sys.platform``, ``sys.version_info`` and ``os.name`` are decided for the interpreter owning the
inspected site (:class:`PyTarget`: this one, or another minor its layout names). A module one of whose functions imports
something and is named outside its own body (a cheap textual gate) is parsed whole, and the calls its top level makes of
its own functions are followed (:func:`_top_calls`: arguments and module-level names bound to literals are known, ``x in
{...}`` and ``x == c`` tests on them are decided, ``__name__`` is the module's, a ``for`` over a constant sequence calls
once per value). The result (:data:`Items`) is JSON-able and cached in the ELF cache's extras under the file's identity.
:mod:`pytest_cudastack.model.process` follows these lists to predict an import.
"""

from __future__ import annotations

import ast
import bisect
import itertools
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_cudastack._sysio import read_text
from pytest_cudastack.linker.elfcache import ElfCache

__all__ = [
    "HOST",
    "Items",
    "PyTarget",
    "module_imports",
    "read_module_source",
    "resolve_from",
    "string_constant",
]

_MODEL = 4  # the version of the import-list rules, part of each cached list's key
_MAX_SOURCE = 16 << 20


@dataclass(frozen=True)
class PyTarget:
    """The interpreter an ``if`` on ``sys.version_info``, ``sys.platform`` or ``os.name`` is decided for:
    this one by default; the Python that owns the inspected site (a 3.12 venv, an image's interpreter)
    when another (:meth:`pytest_cudastack.model.process.Interpreter.for_sites`)."""

    version: tuple[int, int, int] = (sys.version_info[0], sys.version_info[1], sys.version_info[2])
    platform: str = sys.platform
    os_name: str = os.name

    def value(self, key: str) -> Any:
        """What ``sys.platform``, ``os.name`` or ``sys.version_info`` (a final release's) evaluates to."""
        if key == "sys.version_info":
            return (*self.version, "final", 0)
        return {"sys.platform": self.platform, "os.name": self.os_name}.get(key, _UNKNOWN)


HOST = PyTarget()


# --------------------------------------------------------------------------------------------- reading imports


def _truth(test: ast.expr, target: PyTarget) -> bool | None:
    """The value of an ``if`` test the model can decide statically for ``target``, else None."""
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand, target)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        return _bool_truth(test, target)
    if isinstance(test, ast.Compare):
        return _compare_truth(test, target)
    if isinstance(test, ast.Call):
        return _startswith_truth(test, target)
    return None


def _bool_truth(test: ast.BoolOp, target: PyTarget) -> bool | None:
    """An ``and``/``or`` of tests: decided where one operand decides it or every operand is decided."""
    vals = [_truth(v, target) for v in test.values]
    if isinstance(test.op, ast.And):
        return False if False in vals else (None if None in vals else True)
    return True if True in vals else (None if None in vals else False)


_COMPARISONS: dict[type[ast.cmpop], Callable[[object, object], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,  # type: ignore[operator]
    ast.LtE: lambda a, b: a <= b,  # type: ignore[operator]
    ast.Gt: lambda a, b: a > b,  # type: ignore[operator]
    ast.GtE: lambda a, b: a >= b,  # type: ignore[operator]
}


def _compare_truth(test: ast.Compare, target: PyTarget) -> bool | None:
    """One comparison of ``sys.platform``, ``os.name`` or ``sys.version_info`` with a literal, decided
    for ``target``; None for any other comparison."""
    if len(test.ops) != 1 or len(test.comparators) != 1:
        return None
    left, right, op = test.left, test.comparators[0], test.ops[0]
    if not (isinstance(left, ast.Attribute) and isinstance(left.value, ast.Name)):
        return None
    key = f"{left.value.id}.{left.attr}"
    value = target.value(key)
    if value is _UNKNOWN:
        return None
    try:
        other = ast.literal_eval(right)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    fn = _COMPARISONS.get(type(op))
    if fn is None:
        return None
    try:
        return bool(fn(value, other))
    except TypeError:
        return None


def _startswith_truth(test: ast.Call, target: PyTarget) -> bool | None:
    """``sys.platform.startswith("<literal>")``, decided for ``target``; None for any other call."""
    func = test.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "startswith"
        and isinstance(func.value, ast.Attribute)
        and isinstance(func.value.value, ast.Name)
        and f"{func.value.value.id}.{func.value.attr}" == "sys.platform"
        and len(test.args) == 1
        and isinstance(test.args[0], ast.Constant)
        and isinstance(test.args[0].value, str)
    ):
        return target.platform.startswith(test.args[0].value)
    return None


_UNKNOWN = object()


def resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from`` import names in ``module`` (a package when ``is_package``); None when its
    relative level climbs above the top."""
    if not node.level:
        return node.module
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    if not base:
        return None
    return f"{base}.{node.module}" if node.module else base


Items = list[Any]
"""One block's imports in execution order, JSON-able (cached): ``["i", [names]]`` (import the first, then
each other name that is a submodule: ``from P import a``), ``["c", name]`` (a top-level call of ``name``:
a preload trigger), ``["t", body, [handler, ...]]`` (a ``try``: the handlers' items run only when an import
of the body is not found)."""


@dataclass
class _Calls:
    """What the model knows while it reads a module whose top level calls its own functions: the functions
    defined so far (``def`` runs when its statement does), the names bound to literals or to those functions,
    and the calls being followed (a recursion guard)."""

    module: str
    is_package: bool
    defs: dict[str, ast.FunctionDef] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)  # calls already followed (function and arguments)
    target: PyTarget = HOST


@dataclass(frozen=True)
class _Func:
    """A name bound to a module-level function (``__get_hash = __get_openssl_constructor``)."""

    name: str


_MAX_CALL_DEPTH = 8
_MAX_CALLS = 2_000  # distinct calls followed per module: a hostile file's call graph stays bounded


def _value(node: ast.expr | None, env: dict[str, Any]) -> Any:
    """The constant value of ``node`` under ``env`` (literals, names bound to them, tuples and sets of
    them), else _UNKNOWN."""
    if node is None:
        return _UNKNOWN
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(e, env) for e in node.elts]
        if any(v is _UNKNOWN or isinstance(v, _Func) for v in items):
            return _UNKNOWN
        try:
            return frozenset(items) if isinstance(node, ast.Set) else tuple(items)
        except TypeError:  # an unhashable member of a set literal
            return _UNKNOWN
    return _UNKNOWN


def _decide(test: ast.expr, env: dict[str, Any], target: PyTarget) -> bool | None:
    """:func:`_truth`, and ``x in C`` / ``x == c`` (and their negations) between values known in ``env``."""
    truth = _truth(test, target)
    if truth is not None or not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return truth
    left, right, op = _value(test.left, env), _value(test.comparators[0], env), test.ops[0]
    if left is _UNKNOWN or right is _UNKNOWN:
        return None
    try:
        if isinstance(op, (ast.In, ast.NotIn)):
            return (left in right) == isinstance(op, ast.In)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            return bool(left == right) == isinstance(op, ast.Eq)
    except TypeError:
        return None
    return None


def _called(node: ast.stmt, ctx: _Calls, env: dict[str, Any]) -> list[tuple[ast.FunctionDef, dict[str, Any]]]:
    """The module-level functions ``node``'s expressions call (not in nested functions, lambdas or class
    bodies), each with its parameters bound to the constant arguments of the call."""
    out: list[tuple[ast.FunctionDef, dict[str, Any]]] = []
    todo: list[ast.AST] = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
    while todo:
        expr = todo.pop(0)
        if isinstance(expr, (ast.Lambda, ast.FunctionDef, ast.ClassDef)):
            continue
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            target = env.get(expr.func.id, _UNKNOWN)
            name = target.name if isinstance(target, _Func) else expr.func.id
            fn = ctx.defs.get(name)
            if fn is not None and (expr.func.id not in env or isinstance(target, _Func)):
                params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
                bound = {p: _value(a, env) for p, a in zip(params, expr.args, strict=False)}
                bound.update((k.arg, _value(k.value, env)) for k in expr.keywords if k.arg in params)
                out.append((fn, bound))
        todo.extend(ast.iter_child_nodes(expr))
    return out


def _call_items(fn: ast.FunctionDef, bound: dict[str, Any], ctx: _Calls, depth: int) -> Items:
    """The imports a call of module-level function ``fn`` performs, its parameters bound (others unknown)."""
    if fn.name in ctx.active or depth > _MAX_CALL_DEPTH or len(ctx.done) >= _MAX_CALLS:
        return []
    # a call already followed imported what it imports (a second import of a module is a no-op): each
    # distinct call is expanded once, so a call graph with fan-out costs its size, not its paths
    key = repr((fn.name, sorted(bound.items(), key=lambda kv: kv[0])))
    if key in ctx.done:
        return []
    ctx.done.add(key)
    ctx.active.add(fn.name)
    try:
        env = {**ctx.env, **{a.arg: _UNKNOWN for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}}
        env.update(bound)
        return _body_items(fn.body, ctx, env, depth + 1)
    finally:
        ctx.active.discard(fn.name)


def _body_items(body: Sequence[ast.stmt], ctx: _Calls, env: dict[str, Any], depth: int) -> Items:
    """A function body's imports in execution order: decided ``if``s take one branch, undecided ones both, a
    ``try``'s handlers run only when an import of its body is not found (as at module level), loops run
    their body once, and an unconditional ``return`` ends the block; calls of module-level functions are
    followed."""
    out: Items = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend(_imports([node], ctx.module, ctx.is_package, target=ctx.target))
            continue
        if isinstance(node, ast.If):
            truth = _decide(node.test, env, ctx.target)
            for fn, bound in _called(ast.Expr(node.test), ctx, env):
                out.extend(_call_items(fn, bound, ctx, depth))
            if truth is not False:
                out.extend(_body_items(node.body, ctx, env, depth))
            if truth is not True:
                out.extend(_body_items(node.orelse, ctx, env, depth))
            if truth is True and any(isinstance(n, (ast.Return, ast.Raise)) for n in node.body):
                break
            if truth is False and any(isinstance(n, (ast.Return, ast.Raise)) for n in node.orelse):
                break
            continue
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            t: ast.Try = node  # type: ignore[assignment]
            handlers = [_body_items(h.body, ctx, env, depth) for h in t.handlers]
            out.append(["t", _body_items(t.body, ctx, env, depth), handlers])
            out.extend(_body_items(t.orelse, ctx, env, depth))
            out.extend(_body_items(t.finalbody, ctx, env, depth))
            continue
        for fn, bound in _called(node, ctx, env):
            out.extend(_call_items(fn, bound, ctx, depth))
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            out.extend(_body_items(node.body, ctx, env, depth))
        if isinstance(node, (ast.Return, ast.Raise)):
            break
    return out


def _bind(node: ast.stmt, ctx: _Calls) -> None:
    """Record a module-level ``def`` or a binding of a name to a literal or to a function."""
    if isinstance(node, ast.FunctionDef):
        ctx.defs[node.name] = node
        ctx.env.pop(node.name, None)
        return
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        return
    name, value = node.targets[0].id, node.value
    if isinstance(value, ast.Name) and (value.id in ctx.defs or isinstance(ctx.env.get(value.id), _Func)):
        target = ctx.env.get(value.id)
        ctx.env[name] = target if isinstance(target, _Func) else _Func(value.id)
    else:
        ctx.env[name] = _value(value, ctx.env)


def _unique(items: Items) -> Items:
    out: Items = []
    for it in items:
        if it not in out:
            out.append(it)
    return out


def _imports(
    body: Sequence[ast.stmt], module: str, is_package: bool, ctx: _Calls | None = None, target: PyTarget = HOST
) -> Items:
    if ctx is not None:
        target = ctx.target
    out: Items = []
    for node in body:
        if isinstance(node, ast.Import):
            out.extend(["i", [alias.name]] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(module, is_package, node)
            if base is not None:
                out.append(["i", [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]])
        elif isinstance(node, ast.If):
            truth = _truth(node.test, target) if ctx is None else _decide(node.test, ctx.env, target)
            if truth is not False:
                out.extend(_imports(node.body, module, is_package, ctx, target))
            if truth is not True:
                out.extend(_imports(node.orelse, module, is_package, ctx, target))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            t: ast.Try = node  # type: ignore[assignment]
            saved = dict(ctx.env) if ctx is not None else {}
            body_items = _imports(t.body, module, is_package, ctx, target)
            after = dict(ctx.env) if ctx is not None else {}
            handlers = []
            for h in t.handlers:  # a handler's bindings hold only when it runs: the body's are kept
                if ctx is not None:
                    ctx.env.clear()
                    ctx.env.update(saved)
                handlers.append(_imports(h.body, module, is_package, ctx, target))
            if ctx is not None:
                ctx.env.clear()
                ctx.env.update(after)
            out.append(["t", body_items, handlers])
            out.extend(_imports(t.orelse, module, is_package, ctx, target))
            out.extend(_imports(t.finalbody, module, is_package, ctx, target))
        elif isinstance(node, (ast.With, ast.ClassDef)):  # a class body runs when the class statement does
            out.extend(_imports(node.body, module, is_package, ctx, target))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            out.append(["c", node.value.func.id])
        if ctx is not None:
            out.extend(_top_calls(node, ctx))
    return out


def _top_calls(node: ast.stmt, ctx: _Calls) -> Items:
    """The imports module-level statement ``node`` performs by calling the module's own functions (a ``for``
    over a constant sequence calls them once per value), after recording what it binds."""
    if isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef, ast.Import, ast.ImportFrom)):
        return []
    if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
        values = _value(node.iter, ctx.env)
        runs = list(values) if isinstance(values, (tuple, frozenset)) else [_UNKNOWN]
        out: Items = []
        for v in runs[:64]:
            env = {**ctx.env, node.target.id: v}
            out.extend(_body_items(node.body, ctx, env, 0))
        return _unique(out)
    out = []
    for fn, bound in _called(node, ctx, ctx.env):
        out.extend(_call_items(fn, bound, ctx, 0))
    _bind(node, ctx)
    return out


_MAX_GATED = 256  # candidate functions scanned for by name; past this the module is parsed whole
_TOP_LINE = re.compile(r"^[^\s#]", re.M)
_TOP_DEF = re.compile(r"(?:async[ \t]+)?def[ \t]+(\w+)")
_INNER_IMPORT = re.compile(r"^[ \t]+(?:import|from)[ \t]+[\w.]+", re.M)


def _calls_importing_function(text: str) -> bool:
    """Whether a module-level function of ``text`` has an import in its body and its name occurs outside
    that body (a call from the top level, or through another function or an alias): only then is the
    whole module parsed to follow the calls (a cheap textual gate; the parse decides). Linear: one scan for
    the top-level lines, one per body, one for all the candidate names together."""
    starts = [m.start() for m in _TOP_LINE.finditer(text)] + [len(text)]
    spans: dict[str, list[tuple[int, int]]] = {}
    for a, b in itertools.pairwise(starts):
        m = _TOP_DEF.match(text, a)
        if m is not None and _INNER_IMPORT.search(text, a, b):
            spans.setdefault(m.group(1), []).append((a, b))
    if not spans:
        return False
    if len(spans) > _MAX_GATED:  # too many to scan for: let the parse decide
        return True
    names = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(spans, key=len, reverse=True)) + r")\b")
    return any(not _inside(spans[hit.group()], hit.start()) for hit in names.finditer(text))


def _inside(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether ``at`` lies in one of ``spans`` (sorted, disjoint)."""
    i = bisect.bisect_right(spans, (at, sys.maxsize)) - 1
    return i >= 0 and spans[i][0] <= at < spans[i][1]


def _valid_items(items: Any, depth: int = 0) -> bool:
    """Whether a cached value is a well-formed ``Items`` (the cache file may be corrupt)."""
    if not isinstance(items, list) or depth > 100:
        return False
    for it in items:
        if not isinstance(it, list) or not it:
            return False
        if it[0] == "i":
            if len(it) != 2 or not isinstance(it[1], list) or not it[1] or not all(isinstance(n, str) for n in it[1]):
                return False  # an import names at least one module (the model unpacks the first)
        elif it[0] == "c":
            if len(it) != 2 or not isinstance(it[1], str):
                return False
        elif it[0] == "t":
            if len(it) != 3 or not _valid_items(it[1], depth + 1) or not isinstance(it[2], list):
                return False
            if not all(_valid_items(h, depth + 1) for h in it[2]):
                return False
        else:
            return False
    return True


def module_imports(path: str, module: str, is_package: bool, cache: ElfCache | None, target: PyTarget = HOST) -> Items:
    """The imports of a module's top-level code, its ``if``s decided for ``target``: parsed once per run (the
    run's cache memo: each model process of the run asks again), and cached in the ELF cache's extras under
    the file's (dev, inode, size, mtime) and the target's version and platform."""
    if cache is None:
        return _module_imports(path, module, is_package, None, target)
    memo = f"pyimports:{path}\0{module}\0{is_package}\0{target}"
    if memo not in cache.memo:
        cache.memo[memo] = _module_imports(path, module, is_package, cache, target)
    items: Items = cache.memo[memo]
    return items


def _module_imports(path: str, module: str, is_package: bool, cache: ElfCache | None, target: PyTarget) -> Items:
    key: list[Any] | None = None
    if cache is not None:
        try:
            st = os.stat(path)
        except OSError:
            return []
        key = [
            _MODEL,
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            module,
            target.platform,
            list(target.version),
            target.os_name,
        ]
        hit = cache.get_extra(f"pyimports:{cache.file_slot(path)}")
        if isinstance(hit, dict) and hit.get("key") == key and _valid_items(hit.get("items")):
            items: Items = hit["items"]
            return items
    tree = read_module_source(path, strip=True)
    items = [] if tree is None else _imports(tree.body, module, is_package, target=target)
    text = read_text(path, _MAX_SOURCE) if tree is not None else None
    if text is not None and _calls_importing_function(text):
        full = read_module_source(path)  # the function bodies the stripped parse dropped
        if full is not None:
            # imported, never run as a script: ``if __name__ == "__main__":`` blocks stay out
            calls = _Calls(module, is_package, env={"__name__": module}, target=target)
            items = _imports(full.body, module, is_package, calls)
    if cache is not None and key is not None:
        cache.put_extra(f"pyimports:{cache.file_slot(path)}", {"key": key, "items": items})
    return items


# Each string alternative also ends where the tokenizer gives up on an unclosed string (a one-line string at
# its line's end, a triple-quoted one at the end of the text), as a group of its own: an alternative that could
# fail would be retried from the next character, rescanning the rest of the line or text for each quote
# ('"\\' * 20,000 on one line: quadratic). The scan never fails, so it stays linear; a text with an unclosed
# string does not parse (the tokenizer stops there), and the scan says so (_UNCLOSED).
_LEX = re.compile(
    r"""\#[^\n]*"""
    r'''|"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*(?:"""|(?P<u1>\\?\Z))'''
    r"""|'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*(?:'''|(?P<u2>\\?\Z))"""
    r"""|"[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*(?:"|(?P<u3>\\?(?=\n)|\\?\Z))"""
    r"""|'[^'\\\n]*(?:\\[\s\S][^'\\\n]*)*(?:'|(?P<u4>\\?(?=\n)|\\?\Z))"""
    r"""|\\\r?\n"""
)
_UNCLOSED = "\0"  # what an unclosed string becomes: no source holds it (ast.parse refuses NUL)
_QUIET = str.maketrans("()[]{};", "_______")  # inside a one-line string: no bracket or ; the scan would count
_KEPT = frozenset({"import", "from", "if", "elif", "else", "try", "except", "finally", "with", "class"})
_WORD = re.compile(r"[A-Za-z_]\w*")
_CALL = re.compile(r"[A-Za-z_]\w*[ ]*\(")
_TAB_INDENT = re.compile(r"^ *[\t\f]", re.M)


def _quiet(m: re.Match[str]) -> str:
    if m.lastgroup is not None:  # an unclosed string: the module does not parse
        return _UNCLOSED
    token = m.group()
    first = token[0]
    if first == "#":
        return ""
    if first == "\\":
        return " "  # a backslash continuation joins the lines
    if token[:3] in ('"""', "'''"):
        return '""'  # a docstring (the model never reads one): its lines would look like statements
    if "\n" in token:  # a backslash-newline inside a one-line string: one line, as for the tokenizer
        token = token.replace("\\\n", "")
    return token.translate(_QUIET)


def _depth(line: str) -> int:
    return line.count("(") + line.count("[") + line.count("{") - line.count(")") - line.count("]") - line.count("}")


def _top_level_source(text: str) -> str | None:
    """The statements of ``text`` the import model reads (imports, ``if``/``try``/``with``/``class`` blocks,
    calls of a plain name, in their own lines and indentation), everything else dropped: parsing this is a
    fraction of parsing the module (torch's sources: ~1/20). Strings and comments are lexed first (one
    regex, left to right, as the tokenizer does), so a docstring's or a comment's text never looks like a
    statement and a bracket in a string never counts; a logical line goes on while brackets are open; a
    compound statement the model does not follow (``def``, ``for``, ``while``, ``match``, decorators'
    targets) drops every line indented deeper than its header, and ``for``/``while`` their ``else``
    clause too. None where the scan cannot decide (tab or form-feed indentation, brackets closing more than
    they opened, an unclosed string): the caller parses the whole module."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _TAB_INDENT.search(text):
        return None
    src = _LEX.sub(_quiet, text)
    if _UNCLOSED in src:  # an unclosed string (or a NUL): Python's own parse decides (and refuses it)
        return None
    out: list[str] = []
    pending = -1  # indentation of the last header kept, until a body line follows it
    pos, n = 0, len(src)
    while pos < n:
        end = src.find("\n", pos)
        if end < 0:
            end = n
        line = src[pos:end]
        stripped = line.lstrip(" ")
        if not stripped:
            pos = end + 1
            continue
        indent = len(line) - len(stripped)
        start = pos
        depth = _depth(line)
        while depth > 0 and end < n:  # the logical line's continuation lines
            nxt = src.find("\n", end + 1)
            if nxt < 0:
                nxt = n
            depth += _depth(src[end + 1 : nxt])
            end = nxt
        if depth != 0:
            return None
        logical = src[start:end]
        pos = end + 1
        header = logical.rstrip(" ").endswith(":")
        m = _WORD.match(stripped)
        word = m.group() if m else ""
        if word in _KEPT or _CALL.match(stripped) or ";" in logical:
            if pending >= 0 and indent <= pending:
                out.append(" " * (pending + 1) + "pass")
            out.append(logical)
            pending = indent if header else -1
            continue
        if pending >= 0 and indent > pending:
            pending = -1  # the kept header has a body (this dropped statement): no pass needed later
            out.append(" " * indent + "pass")
        if not header:
            continue
        # a compound statement the model does not follow: drop its body (every line indented deeper, found
        # by one regex search), and a for/while's else clause too
        dedent = re.compile(r"\n(?! {" + str(indent + 1) + r"}| *(?:\n|$))")  # a line not blank nor deeper
        while True:
            hit = dedent.search(src, pos - 1)
            pos = n if hit is None else hit.start() + 1
            if word not in ("for", "while") or not src.startswith(" " * indent + "else", pos):
                break
            eol = src.find("\n", pos)
            rest = src[pos + indent + 4 : n if eol < 0 else eol].lstrip(" ")
            if not rest.startswith(":"):
                break
            if rest[1:].strip():  # else: x  (one line): nothing deeper follows
                pos = n if eol < 0 else eol + 1
                break
            pos = n if eol < 0 else eol + 1
            word = ""
    if pending >= 0:
        out.append(" " * (pending + 1) + "pass")
    return "\n".join(out) + "\n"


_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]")
_OPEN = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "([{)]}"))


def _strip_defs(text: str) -> str:
    """``text`` with the body of every ``def`` replaced by ``pass``: the import model never follows function
    bodies, and parsing them is most of the cost (torch's sources: 3x). The header (up to the line where its
    brackets close) is kept; a one-line ``def f(): ...`` is kept whole. A body line is one indented deeper than
    the ``def`` (blank and comment lines included). Text this mangles (a triple-quoted string at a shallower
    indent inside a body) fails to parse, and the caller parses the original instead."""
    lines = text.split("\n")
    out: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        m = _DEF.match(line)
        if m is None:
            out.append(line)
            i += 1
            continue
        indent = len(m.group(1).expandtabs())
        depth = 0
        j = i
        while True:
            code = lines[j].split("#", 1)[0].rstrip()
            brackets = code.translate(_OPEN)
            depth += sum(brackets.count(c) for c in "([{") - sum(brackets.count(c) for c in ")]}")
            out.append(lines[j])
            if depth <= 0 or j + 1 >= n:
                break
            j += 1
        if not code.endswith(":"):  # a one-line def (its body follows the colon): nothing to drop
            i = j + 1
            continue
        out.append(" " * (indent + 1) + "pass")
        j += 1
        while j < n:
            body = lines[j]
            stripped = body.strip()
            if (
                stripped
                and not stripped.startswith("#")
                and len(body.expandtabs()) - len(body.expandtabs().lstrip()) <= indent
            ):
                break
            out.append("")
            j += 1
        i = j
    return "\n".join(out)


def read_module_source(path: str, strip: bool = False) -> ast.Module | None:
    """The module's AST; with ``strip``, of its top-level statements the model reads only (the scan of
    :func:`_top_level_source`, else its text with function bodies dropped, else the whole text: each step
    is tried when the one before it does not parse)."""
    text = read_text(path, _MAX_SOURCE)
    if text is None:
        return None
    if strip:
        top = _top_level_source(text)
        if top is not None:
            try:
                return ast.parse(top, filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                pass  # the scan misread the text: the slower steps decide
        try:
            return ast.parse(_strip_defs(text), filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass  # mangled by the stripping (or not Python): the original decides
    try:
        return ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def string_constant(package_dir: str, spec: str) -> str | None:
    """``FILE:NAME``'s constant value (``version.py:cuda`` -> "13.0") in the package, major only."""
    file, _, name = spec.partition(":")
    tree = read_module_source(os.path.join(package_dir, file))
    if tree is None:
        return None
    for node in tree.body:
        targets = (
            [node.target] if isinstance(node, ast.AnnAssign) else node.targets if isinstance(node, ast.Assign) else []
        )
        value = getattr(node, "value", None)
        for t in targets:
            if isinstance(t, ast.Name) and t.id == name and isinstance(value, ast.Constant):
                return str(value.value).split(".")[0] if value.value is not None else None
    return None

"""pytest hooks of pytest-cudastack: options, markers, fixtures, invariant items, header, xdist.

Imports only pytest and the standard library at module level; everything else is imported when first
needed, so a suite that uses none of this pays (almost) nothing. Facts are computed once per session in a
lazily built ``stack.Stack`` kept in ``config.stash``.

PYTEST_DONT_REWRITE: this module has no asserts; skipping pytest's assertion rewrite of the entry-point
module keeps start-up cheap where byte-code is not cached (PYTHONDONTWRITEBYTECODE).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.findings import Finding
    from pytest_cudastack.markers import Unmet
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import CudaLibs, CudaWheels, Stack

__all__ = ["MARKERS", "header_lines", "settings_key", "stack_key"]

# name -> registration line for `pytest --markers`: signature, what it does, an example.
MARKERS: dict[str, str] = {
    "requires_soname": "requires_soname(*sonames): each shared library must be loadable here (found by the "
    "dynamic linker's search or shipped by an installed wheel); the test fails (or skips with "
    "--cudastack-unmet=skip) otherwise. Example: @pytest.mark.requires_soname('libcudnn.so.9')",
    "requires_wheel": "requires_wheel(*requirements): PEP 508 requirements satisfied by installed, intact "
    "distributions. Example: @pytest.mark.requires_wheel('nvidia-cudnn-cu12>=9')",
    "requires_driver": "requires_driver(spec): the probed (or --cuda-driver) NVIDIA driver version must "
    "satisfy spec. Example: @pytest.mark.requires_driver('>=550')",
    "requires_cuda": "requires_cuda(spec): the highest CUDA version the driver supports must satisfy spec. "
    "Example: @pytest.mark.requires_cuda('>=12.4')",
    "requires_gpu": "requires_gpu(count=1, arch=None, memory=None): at least count GPUs whose compute "
    "capability matches arch (a specifier or sm_XX) with at least memory (bytes or '40GiB'). "
    "Example: @pytest.mark.requires_gpu(2, arch='>=8.0', memory='40GiB')",
}

settings_key: pytest.StashKey[Settings] = pytest.StashKey()
stack_key: pytest.StashKey[Stack] = pytest.StashKey()
_unmet_key: pytest.StashKey[Unmet | None] = pytest.StashKey()

_SECTION_LINES = 4  # lines under a warning in the summary below -v (cause, where, fix, ...)

WORKER_DRIVER = "cudastack_driver"  # workerinput key: the controller's DriverInfo as JSON


class HookSpecs:
    """Hooks pytest-cudastack calls; implement them in a conftest.py or plugin."""

    @pytest.hookspec(firstresult=True)
    def pytest_cudastack_driver(self, config: pytest.Config) -> DriverInfo | None:
        """Return the ``pytest_cudastack.cuda.driver.DriverInfo`` to use instead of probing NVML.

        The first non-None result wins; ``--cuda-driver`` / ``--cuda-arch`` still apply on top of it.
        """


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(HookSpecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack import options

    group = parser.getgroup("cudastack", "pytest-cudastack")
    for option in options.OPTIONS:
        group.addoption(*option.flags, **options.argparse_kwargs(option))
        if option.ini is not None:
            parser.addini(option.key, option.help, type=option.ini)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack import options
    from pytest_cudastack.errors import OptionError
    from pytest_cudastack.settings import absolute_paths, resolve

    cli = {option.key: config.getoption(option.key) for option in options.OPTIONS}

    def ini(key: str) -> Any:
        try:
            return config.getini(key)
        except pytest.UsageError as e:  # pytest's reading of a "bool" value; resolve names the option
            raise ValueError(str(e)) from e

    try:
        settings = resolve(cli, os.environ, ini)
    except OptionError as e:
        raise pytest.UsageError(str(e)) from e
    ini_dir = str(config.inipath.parent) if config.inipath is not None else None
    settings = config.stash[settings_key] = absolute_paths(settings, str(config.invocation_params.dir), ini_dir)
    _check_files(settings)
    if settings.active:  # unused, the plugin adds no per-test reporting hooks
        config.pluginmanager.register(Reporter(config), "cudastack-reporter")
    # "xdist" when auto-loaded from its entry point, "xdist.plugin" when loaded with -p xdist.plugin
    if config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin"):
        config.pluginmanager.register(XdistHooks(), "cudastack-xdist")


def _check_files(settings: Settings) -> None:
    """Usage errors, before the run, for a baseline that is not a snapshot (naming its first wrong field) and
    output files that cannot be written (a directory, a FIFO, a missing step-summary directory), each naming
    its option or variable: found at the end of a run, they would be the run's lost result."""
    if not settings.active:
        return
    # lazy: only a run that reads or writes these files pays for the checks
    from pytest_cudastack._sysio import output_problem

    def named(key: str) -> str:
        src = settings.source(key)
        return "--" + key.replace("_", "-") + ("" if src in ("command line", "default") else f" (from {src})")

    if settings.cudastack_baseline:
        # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
        from pytest_cudastack.errors import DataError
        from pytest_cudastack.stack import load_snapshot

        try:
            load_snapshot(settings.cudastack_baseline)
        except DataError as e:
            raise pytest.UsageError(f"{named('cudastack_baseline')}: {e}") from e
    if settings.cudastack_snapshot:
        why = output_problem(settings.cudastack_snapshot)
        if why is not None:
            raise pytest.UsageError(f"{named('cudastack_snapshot')}: {settings.cudastack_snapshot}: {why}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        why = output_problem(summary, append=True)
        if why is not None:
            raise pytest.UsageError(f"$GITHUB_STEP_SUMMARY: {summary}: {why}")


def _stack(config: pytest.Config) -> Stack:
    """The session's facts, built on first use (on an xdist worker, with the controller's driver)."""
    stack = config.stash.get(stack_key, None)
    if stack is None:
        # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
        from pytest_cudastack.stack import Stack

        driver_info = None
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and WORKER_DRIVER in workerinput:
            # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
            from pytest_cudastack.cuda.driver import DriverInfo

            driver_info = DriverInfo.from_json(json.loads(workerinput[WORKER_DRIVER]))

        def probe() -> DriverInfo | None:
            # None: the stack probes NVML itself, finding the driver's files through its own ELF cache
            hooked: DriverInfo | None = config.hook.pytest_cudastack_driver(config=config)
            return hooked

        stack = Stack(config.stash[settings_key], driver_info=driver_info, probe=probe, rootdir=str(config.rootpath))
        config.stash[stack_key] = stack
        if workerinput is None:  # xdist workers never write the ELF cache (like pytest's cacheprovider)
            config.add_cleanup(stack.flush_cache)
    return stack


class XdistHooks:
    """Registered only when xdist is present: the controller's facts travel to the workers."""

    def pytest_configure_node(self, node: Any) -> None:
        config = node.config
        if config.stash[settings_key].active:
            node.workerinput[WORKER_DRIVER] = json.dumps(_stack(config).driver.to_json())


# markers --------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = [m for m in item.iter_markers() if m.name in MARKERS]
    if not marks:
        return
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack.errors import CudaStackError
    from pytest_cudastack.markers import check_marker, evaluate_all

    try:
        calls = [check_marker(m.name, m.args, m.kwargs) for m in reversed(marks)]
        unmet = evaluate_all(calls, _stack(item.config))
        misuse = None
    except CudaStackError as e:
        misuse = f"cudastack: {e}"
    if misuse is not None:
        pytest.fail(misuse, pytrace=False)  # outside the except block: one message, no chained traceback
    item.stash[_unmet_key] = unmet
    if unmet is not None and item.config.stash[settings_key].cudastack_unmet == "skip":
        pytest.skip(unmet.render(item.config.option.verbose))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    unmet = item.stash.get(_unmet_key, None)
    if unmet is not None:
        pytest.fail(unmet.render(item.config.option.verbose), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    # like skipping.py for skip marks: report an unmet-marker skip at the test, not inside this plugin
    if report.skipped and item.stash.get(_unmet_key, None) is not None and isinstance(report.longrepr, tuple):
        path, line = item.reportinfo()[:2]
        report.longrepr = (str(path), (line or 0) + 1, report.longrepr[2])
    elif report.skipped and item.nodeid.startswith("cudastack::") and isinstance(report.longrepr, tuple):
        # a generated item has no file: "SKIPPED [1] cudastack::arch: no GPU arch known ..." (no line number)
        report.longrepr = (item.nodeid, None, report.longrepr[2])
    return report


# fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cuda_stack(pytestconfig: pytest.Config) -> Stack:
    """The CUDA stack of this machine (session-scoped, computed lazily): ``.driver``, ``.wheels``,
    ``.libs``, ``.inventory``, ``.findings(check)``; ``.to_json()`` gives it all as JSON."""
    return _stack(pytestconfig)


@pytest.fixture(scope="session")
def cuda_driver(cuda_stack: Stack) -> DriverInfo:
    """The NVIDIA driver evaluated against: probed via NVML, or declared with --cuda-driver/--cuda-arch.
    ``.version``, ``.cuda_version`` (highest CUDA supported), ``.gpus``, ``.archs``, ``.source``, ``.reason``."""
    return cuda_stack.driver


@pytest.fixture(scope="session")
def cuda_libs(cuda_stack: Stack) -> CudaLibs:
    """The dynamic linker's view, computed statically: ``.resolve(soname)`` searches as the Python
    executable's DT_NEEDED would (LD_LIBRARY_PATH, ld.so.cache, default dirs) and gives ``.path`` (None when
    not found), ``.route``, ``.tried``, ``.provider``; ``.tree(path)`` the whole load closure of a file.
    Libraries that wheels ship and load by path (torch's nvidia/*/lib) are not on that search; the
    ``cuda_wheels`` fixture and the ``requires_soname`` marker cover them."""
    return cuda_stack.libs


@pytest.fixture(scope="session")
def cuda_wheels(cuda_stack: Stack) -> CudaWheels:
    """Installed CUDA distributions: iterate for ``.name``, ``.version``, ``.cuda_major``, ``.libraries``,
    ``.problems``; ``.get(name)`` looks up any installed distribution."""
    return cuda_stack.wheels


# generated items ------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: the generated items exist before -k / -m deselection and --co listing see the items
    settings = config.stash[settings_key]
    if not settings.items and not settings.cudastack_scan:
        return
    if _selects_tests(config) and not any(src == "command line" for _, src in settings.sources):
        return  # `pytest tests/test_x.py::test_y` runs that test; ini-driven items join whole-suite runs only
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack.items import CudaStackCollector

    collector = CudaStackCollector.for_session(session, lambda: _stack(config))
    generated = list(collector.collect())
    # reported like any collected node, so "collected N items" and collection-aware plugins count them
    report = pytest.CollectReport(collector.nodeid, "passed", None, list(generated))
    config.hook.pytest_collectreport(report=report)
    items[:0] = generated


def _selects_tests(config: pytest.Config) -> bool:
    """Whether the command line names tests: a node ID (``path::name``) or a file, as pytest's own
    argument handling reads them (``Config.args`` from ``ArgsSource.ARGS``). No arguments, ``testpaths``
    and directories are runs of (part of) the suite, which the ini-driven items join."""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return False
    base = str(config.invocation_params.dir)
    for arg in config.args:
        path = arg.split("::", 1)[0]
        if "::" in arg or os.path.isfile(os.path.join(base, path)):
            return True
    return False


# reporting ------------------------------------------------------------------------------------------


def pytest_report_header(config: pytest.Config) -> list[str]:
    # Quiet unless asked: probing the driver and reading the wheels is not free, so with no cudastack
    # option active the header appears only at -vv (one line when active, details from -v).
    settings = config.stash.get(settings_key, None)
    if settings is None or (not settings.active and config.option.verbose < 2) or hasattr(config, "workerinput"):
        return []
    return header_lines(_stack(config), config.option.verbose)


HEADER_WIDTH = 120


def header_lines(stack: Stack, verbose: int = 0) -> list[str]:
    """``pytest_report_header``'s lines: one line of at most ``HEADER_WIDTH`` columns (driver | CUDA | GPUs |
    CUDA wheels | options); the probe's whole story (its reason, notes, GPUs, wheels) with -v."""
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack.markers import short_reason

    d = stack.driver
    driver = f"driver {d.version} ({d.source})" if d.version else f"driver none ({short_reason(d.reason)})"
    parts = [driver, f"CUDA <= {d.cuda_version}" if d.cuda_version else "CUDA: unknown"]
    if d.gpus:
        names = sorted({g.name for g in d.gpus})
        parts.append(f"GPUs: {len(d.gpus)} x {', '.join(names)}")
    elif d.archs:
        parts.append(f"GPUs: archs {','.join(d.archs)} ({d.arch_source})")
    else:
        parts.append("GPUs: none")
    wheels = stack.wheels
    majors: dict[int, int] = {}
    for dist in wheels:
        if dist.cuda_major is not None:
            majors[dist.cuda_major] = majors.get(dist.cuda_major, 0) + 1
    flavours = ", ".join(f"cu{m}: {n}" for m, n in sorted(majors.items()))
    wheels_part = f"{len(wheels)} CUDA wheels" + (f" ({flavours})" if flavours else "")
    parts.append(wheels_part)
    s = stack.settings
    for key in ("cuda_max", "cuda_min"):
        if getattr(s, key) is not None:
            parts.append(s.describe(key))
    if s.cudastack_scan:
        count = len(stack.scan_targets)
        parts.append(f"scan: {count} file{'' if count == 1 else 's'}")
    lines = [_fit("cudastack: ", parts, droppable=("GPUs: none", wheels_part))]
    if verbose > 0:
        if d.reason:
            lines.append(f"  driver: {d.reason}")
        lines.extend(
            f"  GPU {g.index}: {g.name} (sm {g.compute_capability or '?'}"
            + (f", {g.memory_total / 2**30:.1f} GiB" if g.memory_total else "")
            + ")"
            for g in d.gpus
        )
        lines.extend(f"  driver note: {n}" for n in d.notes)
        lines.extend(f"  wheel: {dist.label} (CUDA {dist.cuda_major}: {dist.cuda_evidence})" for dist in wheels)
    return lines


def _fit(prefix: str, parts: list[str], droppable: tuple[str, ...]) -> str:
    """``prefix`` + ``parts`` joined by " | " in ``HEADER_WIDTH`` columns: the ``droppable`` parts go first
    (in that order), then the tail is cut, marked "... (-v)" (the -v lines say it all)."""
    kept = list(parts)
    for part in droppable:
        if len(prefix + " | ".join(kept)) <= HEADER_WIDTH:
            break
        if part in kept[1:]:
            kept.remove(part)
    line = prefix + " | ".join(kept)
    while len(line) > HEADER_WIDTH and len(kept) > 1:
        kept.pop()
        line = prefix + " | ".join([*kept, "... (-v)"])
    return line


class Reporter:
    """Registered when an option is active: the generated items' reports, the terminal summary, JUnit
    properties, the snapshot and $GITHUB_STEP_SUMMARY at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.reports: list[pytest.TestReport] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid.startswith("cudastack::") and (report.when == "call" or report.outcome != "passed"):
            self.reports.append(report)

    def findings(self) -> list[tuple[pytest.TestReport, list[str]]]:
        if not self.reports:
            return []
        # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
        from pytest_cudastack.items import FINDING_PROPERTY

        out = []
        for report in self.reports:
            props = [str(v) for k, v in report.user_properties if k == FINDING_PROPERTY]
            if props:
                out.append((report, props))
        return out

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        # one section per concern, each printing nothing when it has nothing to say
        self.findings_section(terminalreporter)
        _repair_summary(self.config, [r for r in self.reports if r.failed], terminalreporter)

    def findings_section(self, terminalreporter: Any) -> None:
        """The ``cudastack`` section: warnings (and with -v infos) of the generated items, each once.

        Errors are in their item's failure above and the short summary names the item; the section
        does not repeat them. Warnings are yellow, through pytest's terminal writer (``--color``)."""
        verbose = self.config.option.verbose
        shown = ("warning:", "info:") if verbose > 0 else ("warning:",)
        found = [(r, [p for p in props if p.startswith(shown)]) for r, props in self.findings()]
        found = [(r, props) for r, props in found if props]
        if not found:
            return
        terminalreporter.write_sep("=", "cudastack")
        for report, props in found:
            terminalreporter.write_line(f"{report.nodeid} ({report.outcome})")
            for prop in props:
                first, *rest = prop.splitlines()
                if verbose <= 0 and len(rest) > _SECTION_LINES:
                    more = len(rest) - _SECTION_LINES + 1
                    rest = [*rest[: _SECTION_LINES - 1], f"  ... {more} more (-v)"]
                terminalreporter.write_line("  " + first, yellow=first.startswith("warning:"))
                for line in rest:
                    terminalreporter.write_line("    " + line)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        config = self.config
        if hasattr(config, "workerinput"):
            return  # xdist workers write neither files nor the ELF cache
        stack = _stack(config)
        _junit_properties(config, stack)
        snapshot = config.stash[settings_key].cudastack_snapshot
        if snapshot:
            # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
            from pytest_cudastack.errors import CudaStackError
            from pytest_cudastack.stack import write_snapshot

            try:
                write_snapshot(stack, snapshot)
            except CudaStackError as e:  # a finding about the run's output, not an internal error
                reporter = config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_line(f"cudastack: --cudastack-snapshot: {e}", red=True)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            self.step_summary(summary, stack)

    def step_summary(self, path: str, stack: Stack) -> None:
        """Append a Markdown table of the generated items to ``$GITHUB_STEP_SUMMARY``."""
        d = stack.driver
        rows = ["### cudastack", "", f"driver {d.version or 'none'} ({d.source}), CUDA <= {d.cuda_version or '?'}"]
        rows += ["", "| item | outcome | findings |", "|---|---|---|"]
        found = {r.nodeid: props for r, props in self.findings()}
        for report in self.reports:
            cells = [p.splitlines()[0].replace("|", "\\|") for p in found.get(report.nodeid, [])]
            rows.append(f"| `{report.nodeid}` | {report.outcome} | {'<br>'.join(cells) or '-'} |")
        # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
        from pytest_cudastack._sysio import append_text

        error = append_text(path, "\n".join(rows) + "\n\n")
        if error is not None:  # it changed since pytest_configure checked it
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"cudastack: $GITHUB_STEP_SUMMARY: {path}: {error.strerror or error}", red=True)


def _repair_summary(config: pytest.Config, failed: list[pytest.TestReport], terminalreporter: Any) -> None:
    """The repair plan for the failed invariant items (``checks.repair``), one per environment, at the end."""
    names = [r.nodeid.partition("::")[2] for r in failed if r.nodeid.startswith("cudastack::")]
    names = [n for n in names if "[" not in n]  # per-target items (scan) name binaries: nothing pip repairs
    if not names:
        return
    # lazy: an unused plugin imports only pytest and the stdlib (benchmarks/bench_plugin.py)
    from pytest_cudastack.checks.repair import plan_repairs, render_plans
    from pytest_cudastack.errors import CudaStackError

    stack = _stack(config)
    found: list[Finding] = []
    for name in names:
        try:
            found.extend(stack.findings(name))
        except (CudaStackError, ValueError):  # the item failed on its input (a bad baseline): nothing pip repairs
            continue
    text = render_plans(plan_repairs(found, stack.inventory))
    for line in text.splitlines():
        terminalreporter.write_line(line)


def _junit_properties(config: pytest.Config, stack: Stack) -> None:
    # junitxml's LogXML (public method add_global_property) is what record_testsuite_property uses; it
    # lives on the controller only, so this works with xdist where the fixture does not.
    xml = next((p for p in config.pluginmanager.get_plugins() if hasattr(p, "add_global_property")), None)
    if xml is None:
        return
    d = stack.driver
    xml.add_global_property("cudastack.driver", f"{d.version or 'none'} ({d.source})")
    xml.add_global_property("cudastack.cuda", d.cuda_version or "unknown")
    gpus = ", ".join(f"{g.name} ({g.compute_capability})" for g in d.gpus) or (
        f"archs {','.join(d.archs)}" if d.archs else "none"
    )
    xml.add_global_property("cudastack.gpus", gpus)

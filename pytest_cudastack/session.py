"""The plugin's work for one pytest run: settings, the stack, markers, generated items, header, summary.

:mod:`pytest_cudastack.plugin` (the hooks pytest loads) imports this module on first active use: when an
option is set, or a marker, a fixture or the ``-vv`` header needs the stack. It builds one ``CudaStackRun``
per run and keeps it in ``config.stash``; when the settings ask for work, the run is also registered as a
plugin for the hooks below (items, reports, summary, files) and, with xdist, ``XdistHooks``.

Under xdist each invariant item's call report carries its findings as data (``items.ItemResult``, serialised
with the report); the controller builds its summary, JUnit properties and repair plan from the reports it
receives and never runs a check (it builds the wheel inventory the repair planner reads).
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import pytest

from pytest_cudastack import options
from pytest_cudastack._sysio import append_text, output_problem, write_atomic
from pytest_cudastack.checks import CHECKS
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.errors import CudaStackError, DataError, OptionError
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.items import (
    REPORT_RESULT,
    CudaStackCollector,
    InvariantItem,
    ItemResult,
    finding_properties,
    headlines,
    render_findings,
)
from pytest_cudastack.markers import Unmet, check_marker, evaluate_all, short_reason
from pytest_cudastack.model.repair import RepairPlan, plan_repairs, render_plans
from pytest_cudastack.settings import Settings, absolute_paths, resolve
from pytest_cudastack.stack import Stack, load_snapshot, write_snapshot

if TYPE_CHECKING:
    from collections.abc import Generator, Mapping, Sequence

__all__ = [
    "HEADER_WIDTH",
    "ITEM_ROOT",
    "WORKER_DRIVER",
    "CudaStackRun",
    "XdistHooks",
    "header_lines",
    "select_named",
    "start",
]

WORKER_DRIVER = "cudastack_driver"  # workerinput key: the controller's DriverInfo as JSON
ITEM_ROOT = "cudastack"  # the node ID of the generated items' collector (items.CudaStackCollector)
HEADER_WIDTH = 120
_SECTION_LINES = 4  # lines under a warning in the summary below -v (cause, where, fix, ...)

_unmet_key: pytest.StashKey[Unmet | None] = pytest.StashKey()


def start(config: pytest.Config, *, given: bool, named: tuple[str, ...] = ()) -> CudaStackRun:
    """The run's state: ``given`` (an option is set somewhere) resolves the settings from the command line,
    the environment and the ini file (a bad value is a usage error naming it), else the defaults are the
    settings. ``named``: the items the command line names by node ID (``cudastack::closure``), which turn on
    the ``--cudastack`` items when one of those is named and off. A run whose settings ask for work registers
    its hooks."""
    settings = _resolve(config) if given else Settings()
    if named and not settings.cudastack and _names_a_cudastack_item(named, settings):
        settings = settings.with_values(cudastack=True)
    _check_named(named, settings)
    run = CudaStackRun(config, settings, named)
    if settings.active or named:
        _check_files(settings)
        config.pluginmanager.register(run, "cudastack-run")
        # "xdist" when auto-loaded from its entry point, "xdist.plugin" when loaded with -p xdist.plugin
        if config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin"):
            config.pluginmanager.register(XdistHooks(run), "cudastack-xdist")
    return run


def _names_a_cudastack_item(named: Sequence[str], settings: Settings) -> bool:
    """Whether ``named`` (node IDs) names an item that ``--cudastack`` turns on and ``settings`` do not: the
    run that printed ``cudastack::closure`` had it on; its node ID alone re-runs it."""
    on = settings.with_values(cudastack=True)
    for node_id in named:
        name = node_id.partition("::")[2].partition("[")[0]
        if not name:  # `cudastack`: every item the options turn on, or the --cudastack ones
            return not settings.items and not settings.cudastack_scan
        check = CHECKS.get(name)
        if check is not None and not check.enabled(settings) and check.enabled(on):
            return True
    return False


def _check_named(named: Sequence[str], settings: Settings) -> None:
    """A usage error, before collection (on xdist's controller too), for a node ID naming no item the settings
    turn on; a per-target item's target (``scan[bin/app]``) is looked for among the collected items."""
    unknown = []
    for node_id in named:
        name = node_id.partition("::")[2].partition("[")[0]
        check = CHECKS.get(name)
        if name and (check is None or not check.enabled(settings)):
            unknown.append(node_id)
    if unknown:
        here = ", ".join(f"{ITEM_ROOT}::{name}" for name in settings.items) or "none: no option turns one on"
        if settings.cudastack_scan:
            here += f", {ITEM_ROOT}::scan[...]"
        raise pytest.UsageError(f"not found: {', '.join(unknown)} (cudastack items here: {here})")


def select_named(items: Sequence[pytest.Item], named: Sequence[str]) -> tuple[list[pytest.Item], list[str]]:
    """(the ``items`` that ``named`` node IDs select, in order; the IDs that select none). As pytest reads
    ``test_x.py::test_a``: ``cudastack`` selects every item, ``cudastack::scan`` every ``scan[...]``."""
    chosen: set[str] = set()
    unmatched = []
    for node_id in named:
        hits = [
            item.nodeid
            for item in items
            if node_id in (ITEM_ROOT, item.nodeid) or item.nodeid.startswith(f"{node_id}[")
        ]
        chosen.update(hits)
        if not hits:
            unmatched.append(node_id)
    return [item for item in items if item.nodeid in chosen], unmatched


def _resolve(config: pytest.Config) -> Settings:
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
    return absolute_paths(settings, str(config.invocation_params.dir), ini_dir)


def _check_files(settings: Settings) -> None:
    """Usage errors, before the run, for a baseline that is not a snapshot (naming its first wrong field) and
    output files that cannot be written (a directory, a FIFO, a missing step-summary directory), each naming
    its option or variable: found at the end of a run, they would be the run's lost result."""
    if settings.cudastack_baseline:
        try:
            load_snapshot(settings.cudastack_baseline)
        except DataError as e:
            raise pytest.UsageError(f"{settings.named('cudastack_baseline')}: {e}") from e
    if settings.cudastack_snapshot:
        why = output_problem(settings.cudastack_snapshot)
        if why is not None:
            raise pytest.UsageError(f"{settings.named('cudastack_snapshot')}: {settings.cudastack_snapshot}: {why}")
    if settings.cudastack_image:
        # lazy: only a run judging an image reads one; opened here (materialised in the cache, which the
        # stack then reuses) so that an image that cannot be read is a usage error before collection
        from pytest_cudastack.image.rootfs import open_image

        try:
            open_image(settings.cudastack_image, settings.cudastack_image_platform)
        except CudaStackError as e:
            raise pytest.UsageError(f"{settings.named('cudastack_image')}: {e}") from e
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        why = output_problem(summary, append=True)
        if why is not None:
            raise pytest.UsageError(f"$GITHUB_STEP_SUMMARY: {summary}: {why}")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


class CudaStackRun:
    """One run's settings and stack. Its ``pytest_*`` methods are hooks, registered when the settings ask
    for work: the generated items, their reports (kept, and serialised with their findings), the terminal
    summary, JUnit properties, the snapshot and ``$GITHUB_STEP_SUMMARY``. Its other methods are what the
    hooks of :mod:`pytest_cudastack.plugin` call."""

    def __init__(self, config: pytest.Config, settings: Settings, named: tuple[str, ...] = ()) -> None:
        self.config = config
        self.settings = settings
        self.named = named  # the items the command line names by node ID
        self.reports: list[pytest.TestReport] = []
        self._stack: Stack | None = None
        self._plans: tuple[RepairPlan, ...] | None = None

    @property
    def stack(self) -> Stack:
        """The session's facts, built on first use (on an xdist worker, with the controller's driver)."""
        if self._stack is None:
            config = self.config
            driver_info = None
            workerinput = getattr(config, "workerinput", None)
            if workerinput is not None and WORKER_DRIVER in workerinput:
                driver_info = DriverInfo.from_json(json.loads(workerinput[WORKER_DRIVER]))

            def probe() -> DriverInfo | None:
                # None: the stack probes NVML itself, finding the driver's files through its own ELF cache
                hooked: DriverInfo | None = config.hook.pytest_cudastack_driver(config=config)
                return hooked

            self._stack = Stack(self.settings, driver_info=driver_info, probe=probe, rootdir=str(config.rootpath))
            if workerinput is None:  # xdist workers never write the ELF cache (like pytest's cacheprovider)
                config.add_cleanup(self._stack.flush_cache)
        return self._stack

    # markers ----------------------------------------------------------------------------------------
    def setup_markers(self, item: pytest.Item, marks: Sequence[pytest.Mark]) -> None:
        """Evaluate an item's ``requires_*`` marks: misuse fails it, unmet skips it (``--cudastack-unmet=skip``)
        or fails it in ``call_markers``."""
        try:
            calls = [check_marker(m.name, m.args, m.kwargs) for m in reversed(marks)]
            unmet = evaluate_all(calls, self.stack)
            misuse = None
        except CudaStackError as e:
            misuse = f"cudastack: {e}"
        if misuse is not None:
            pytest.fail(misuse, pytrace=False)  # outside the except block: one message, no chained traceback
        item.stash[_unmet_key] = unmet
        if unmet is not None and self.settings.cudastack_unmet == "skip":
            pytest.skip(unmet.render(self.config.option.verbose))

    def call_markers(self, item: pytest.Item) -> None:
        unmet = item.stash.get(_unmet_key, None)
        if unmet is not None:
            pytest.fail(unmet.render(self.config.option.verbose), pytrace=False)

    def adjust_report(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """Where a skip is reported, and an invariant item's findings on its call report (``REPORT_RESULT``)."""
        # like skipping.py for skip marks: report an unmet-marker skip at the test, not inside this plugin
        if report.skipped and item.stash.get(_unmet_key, None) is not None and isinstance(report.longrepr, tuple):
            path, line = item.reportinfo()[:2]
            report.longrepr = (str(path), (line or 0) + 1, report.longrepr[2])
        elif report.skipped and isinstance(item, InvariantItem) and isinstance(report.longrepr, tuple):
            # a generated item has no file: "SKIPPED [1] cudastack::arch: no GPU arch known ..." (no line number)
            report.longrepr = (item.nodeid, None, report.longrepr[2])  # type: ignore[assignment]
        if isinstance(item, InvariantItem) and report.when == "call":
            setattr(report, REPORT_RESULT, item.result())  # pytest: "reports can contain arbitrary extra attributes"

    # header -----------------------------------------------------------------------------------------
    def header(self) -> list[str]:
        # Quiet unless asked: probing the driver and reading the wheels is not free, so with no cudastack
        # option active the header appears only at -vv (one line when active, details from -v).
        verbose = self.config.option.verbose
        if (not self.settings.active and verbose < 2) or _is_worker(self.config):
            return []
        return header_lines(self.stack, verbose)

    # hooks, registered when the settings ask for work ------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        # tryfirst: the generated items exist before -k / -m deselection and --co listing see the items
        settings = self.settings
        if not self.named:
            if not settings.items and not settings.cudastack_scan:
                return
            if _selects_tests(self.config) and not any(src == "command line" for _, src in settings.sources):
                return  # `pytest tests/test_x.py::test_y` runs that test; ini-driven items join whole-suite runs only
        collector = CudaStackCollector.for_session(session, lambda: self.stack)
        generated = list(collector.collect())
        if self.named:
            generated, unmatched = select_named(generated, self.named)
            if unmatched:
                here = ", ".join(item.nodeid for item in collector.collect()) or "none: no option turns one on"
                raise pytest.UsageError(f"not found: {', '.join(unmatched)} (cudastack items here: {here})")
        # reported like any collected node, so "collected N items" and collection-aware plugins count them
        report = pytest.CollectReport(collector.nodeid, "passed", None, list(generated))
        self.config.hook.pytest_collectreport(report=report)
        items[:0] = generated

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, report: pytest.CollectReport | pytest.TestReport) -> Any:
        data = yield
        result = getattr(report, REPORT_RESULT, None)
        if isinstance(data, dict) and isinstance(result, ItemResult):
            data[REPORT_RESULT] = result.to_json()
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self, data: dict[str, Any]) -> Any:
        report = yield
        raw = data.get(REPORT_RESULT)
        if report is not None and isinstance(raw, dict):
            setattr(report, REPORT_RESULT, ItemResult.from_json(raw))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid.startswith("cudastack::") and (report.when == "call" or report.outcome != "passed"):
            self.reports.append(report)

    def results(self) -> list[tuple[pytest.TestReport, ItemResult]]:
        """The kept reports that carry findings (each call report of an item that ran its check)."""
        out = []
        for report in self.reports:
            result = getattr(report, REPORT_RESULT, None)
            if isinstance(result, ItemResult):
                out.append((report, result))
        return out

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Any:
        # outermost wrapper: the plan (the cause and each command, once) comes before pytest's FAILURES
        # section, on the first screen; the failures point at it; the warnings section comes after them
        self.repair_section(terminalreporter)
        result = yield
        self.findings_section(terminalreporter)
        return result

    def failing_findings(self) -> list[Finding]:
        """The findings of the failed invariant items, from their reports (every error the plan covers)."""
        return [f for report, result in self.results() if report.failed for f in result.findings]

    def plans(self) -> tuple[RepairPlan, ...]:
        """The run's repair plan, one per environment, over the failed items' findings: built once, from the
        reports (under xdist the controller runs no check; it reads the inventory the planner needs)."""
        if self._plans is None:
            found = self.failing_findings()
            failing = any(f.failing for f in found)
            self._plans = (
                plan_repairs(
                    found,
                    self.stack.inventory,
                    reqs=self.stack.requirements,
                    machine=self.stack.environment,
                    place=self.stack.image.image_path if self.stack.image is not None else None,
                )
                if failing
                else ()
            )
        return self._plans

    def findings_section(self, terminalreporter: Any) -> None:
        """The ``cudastack`` section: warnings (and with -v infos) of the generated items, each once.

        Errors are in their item's failure above and the short summary names the item; the section
        does not repeat them. Warnings are yellow, through pytest's terminal writer (``--color``)."""
        verbose = self.config.option.verbose
        shown = (Severity.WARNING, Severity.INFO) if verbose > 0 else (Severity.WARNING,)
        found = [
            (report, [text for severity, text in finding_properties(result.findings) if severity in shown])
            for report, result in self.results()
        ]
        found = [(report, texts) for report, texts in found if texts]
        if not found:
            return
        terminalreporter.write_sep("=", "cudastack")
        for report, texts in found:
            terminalreporter.write_line(f"{report.nodeid} ({report.outcome})")
            for text in texts:
                first, *rest = text.splitlines()
                if verbose <= 0 and len(rest) > _SECTION_LINES:
                    more = len(rest) - _SECTION_LINES + 1
                    rest = [*rest[: _SECTION_LINES - 1], f"  ... {more} more (-v)"]
                terminalreporter.write_line("  " + first, yellow=first.startswith("warning:"))
                for line in rest:
                    terminalreporter.write_line("    " + line)

    def repair_section(self, terminalreporter: Any) -> None:
        """The ``cudastack repair plan`` section (``model.repair``): per environment the cause in one line,
        then every step (automatic pip commands the model verified, manual steps), each printed once."""
        text = render_plans(self.plans(), self.failing_findings())
        if not text:
            return
        terminalreporter.write_sep("=", "cudastack repair plan")
        for line in text.splitlines():
            terminalreporter.write_line(line, bold=line.lstrip().startswith(tuple("123456789")))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self) -> Generator[None, object, object]:
        # before pytest's junitxml writes its file: the global properties; after: what it cannot write
        if not _is_worker(self.config):  # xdist workers write neither files nor the ELF cache
            self.finish()
        result = yield
        if not _is_worker(self.config):
            self.junit_output()
        return result

    def finish(self) -> None:
        """The run's files: JUnit's global properties, the snapshot, ``$GITHUB_STEP_SUMMARY``."""
        config = self.config
        stack = self.stack
        _junit_properties(config, stack, self.plans())
        snapshot = self.settings.cudastack_snapshot
        if snapshot:
            try:
                write_snapshot(stack, snapshot)
            except CudaStackError as e:  # a finding about the run's output, not an internal error
                reporter = config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_line(f"cudastack: --cudastack-snapshot: {e}", red=True)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            self.step_summary(summary, stack)

    def junit_output(self) -> None:
        """What CI tools show of a JUnit file, added to the one pytest's junitxml wrote (``--junitxml``): each
        item's findings in its testcase's system-out and its errors in its failure's message (pytest's
        message is the short summary's line), the repair plan in the suite's system-out. pytest writes no
        suite-level output and no testcase output under the default ``junit_logging = no``."""
        path = getattr(self.config.option, "xmlpath", None)
        if not path or not os.path.isfile(path):
            return
        cases = {
            report.nodeid.split("::", 1)[1]: result.findings for report, result in self.results() if result.findings
        }
        plan = render_plans(self.plans(), self.failing_findings())
        if not cases and not plan:
            return
        try:
            with open(path, encoding="utf-8") as f:
                tree = ElementTree.parse(f)
        except (OSError, ElementTree.ParseError) as e:
            self._warn(f"cudastack: --junitxml: {path}: cannot add the findings: {e}")
            return
        for suite in tree.getroot().iter("testsuite"):
            _junit_suite(suite, cases, plan)
        text = '<?xml version="1.0" encoding="utf-8"?>' + ElementTree.tostring(tree.getroot(), encoding="unicode")
        error = write_atomic(os.path.dirname(os.path.abspath(path)), path, text, mode=0o666)
        if error is not None:
            self._warn(f"cudastack: --junitxml: {path}: cannot add the findings: {error.strerror or error}")

    def _warn(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line, red=True)

    def step_summary(self, path: str, stack: Stack) -> None:
        """Append a Markdown table of the generated items to ``$GITHUB_STEP_SUMMARY``."""
        d = stack.driver
        rows = ["### cudastack", "", f"driver {d.version or 'none'} ({d.source}), CUDA <= {d.cuda_version or '?'}"]
        rows += ["", "| item | outcome | findings |", "|---|---|---|"]
        found = {report.nodeid: result.findings for report, result in self.results()}
        for report in self.reports:
            texts = [text for _, text in finding_properties(found.get(report.nodeid, ()))]
            cells = [text.splitlines()[0].replace("|", "\\|") for text in texts]
            rows.append(f"| `{report.nodeid}` | {report.outcome} | {'<br>'.join(cells) or '-'} |")
        rows += _plan_rows(self.plans())
        error = append_text(path, "\n".join(rows) + "\n\n")
        if error is not None:  # it changed since pytest_configure checked it
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"cudastack: $GITHUB_STEP_SUMMARY: {path}: {error.strerror or error}", red=True)


class XdistHooks:
    """Registered only when xdist is present: the controller's facts travel to the workers."""

    def __init__(self, run: CudaStackRun) -> None:
        self.run = run

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_DRIVER] = json.dumps(self.run.stack.driver.to_json())


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


def header_lines(stack: Stack, verbose: int = 0) -> list[str]:
    """``pytest_report_header``'s lines: one line of at most ``HEADER_WIDTH`` columns (driver | CUDA | GPUs |
    CUDA wheels | options); the probe's whole story (its reason, notes, GPUs, wheels) with -v."""
    d = stack.driver
    driver = f"driver {d.version} ({d.source})" if d.version else f"driver none ({short_reason(d.reason)})"
    parts = [driver, f"CUDA <= {d.cuda_version}" if d.cuda_version else "CUDA: unknown"]
    if stack.image is not None:
        parts.insert(0, f"image {stack.image.reference}")
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
        lines.append(f"  stack fingerprint: {stack.fingerprint} (cudastack snapshot; cudastack fleet groups by it)")
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


# XML 1.0 forbids these characters even escaped; pytest's junitxml writes them as #xNN (bin_xml_escape)
_XML_ILLEGAL = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _XML_ILLEGAL.sub(lambda m: f"#x{ord(m.group()):02X}", text)


def _junit_suite(suite: ElementTree.Element, cases: Mapping[str, Sequence[Finding]], plan: str) -> None:
    """Add the findings of our testcases (classname ``[prefix.]cudastack``, name the item's) and the plan."""
    for case in suite.iter("testcase"):
        findings = cases.get(case.get("name", ""))
        if findings is None or case.get("classname", "").rsplit(".", 1)[-1] != "cudastack":
            continue
        failure = case.find("failure")
        if failure is not None and any(f.failing for f in findings):
            failure.set("message", _xml_text(headlines(findings)))
        _append_output(case, render_findings(findings))
    if plan:
        _append_output(suite, "cudastack repair plan\n" + plan)


def _append_output(element: ElementTree.Element, text: str) -> None:
    """``text`` in ``element``'s ``<system-out>`` (after what is there: one per element, as JUnit's schema says)."""
    out = element.find("system-out")
    if out is None:
        out = ElementTree.SubElement(element, "system-out")
    out.text = (out.text + "\n" if out.text else "") + _xml_text(text)


def _plan_rows(plans: Sequence[RepairPlan]) -> list[str]:
    """The repair plan as Markdown for the step summary: per environment, its numbered steps."""
    rows: list[str] = []
    for plan in plans:
        if not plan.steps:
            continue
        rows += ["", f"#### repair plan for `{plan.environment}`", ""]
        for i, step in enumerate(plan.steps, 1):
            label = "run" if step.kind == "automatic" else "by hand"
            rows.append(
                f"{i}. {label}: `{step.command.replace('`', chr(39))}`" + (f" ({step.why})" if step.why else "")
            )
    return rows


def _junit_properties(config: pytest.Config, stack: Stack, plans: Sequence[RepairPlan] = ()) -> None:
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
    for plan in plans:  # the plan's steps, numbered as printed: what CI dashboards reading JUnit show
        for i, step in enumerate(plan.steps, 1):
            label = "run" if step.kind == "automatic" else "by hand"
            xml.add_global_property(f"cudastack.repair.{plan.environment}.{i}", f"[{label}] {step.command}")

"""pytest hooks of pytest-cudastack: options, markers, fixtures, header, and the dispatch to the run.

The lazy-import rule, said once: this module (the ``cudastack`` entry point) imports only pytest, the
standard library and the option table (:mod:`pytest_cudastack.options`). Everything else is the work of
:mod:`pytest_cudastack.session`, imported by ``_run`` on first active use: an option set on the command line,
in the environment or in the ini file, a ``requires_*`` marker, a ``cuda_*`` fixture, the ``-vv`` header.
A suite that uses none of this pays for the option table only (``benchmarks/bench_plugin.py``). The run
(settings resolved once, the lazily built ``stack.Stack``) is kept in ``config.stash``.

PYTEST_DONT_REWRITE: this module has no asserts; skipping pytest's assertion rewrite of the entry-point
module keeps start-up cheap where byte-code is not cached (PYTHONDONTWRITEBYTECODE).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudastack import options

if TYPE_CHECKING:
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.session import CudaStackRun
    from pytest_cudastack.stack import CudaLibs, CudaWheels, Stack

__all__ = [
    "ITEMS_ROOT",
    "MARKERS",
    "MARK_TYPO_DISTANCE",
    "HookSpecs",
    "edit_distance",
    "meant_marker",
    "run_key",
    "take_node_ids",
]

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

run_key: pytest.StashKey[CudaStackRun] = pytest.StashKey()
ITEMS_ROOT = "cudastack"  # the collector of the generated items: their node IDs read cudastack::NAME


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
    group = parser.getgroup("cudastack", "pytest-cudastack")
    for option in options.OPTIONS:
        group.addoption(*option.flags, **options.argparse_kwargs(option))
        if option.ini is not None:
            parser.addini(option.key, option.help, type=option.ini)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    named = take_node_ids(config)
    if named or _given(config):  # resolved now: a bad value is a usage error before collection
        _run(config, given=True, named=named)


def take_node_ids(config: pytest.Config) -> tuple[str, ...]:
    """The command-line arguments naming generated items by the node IDs pytest prints (``cudastack``,
    ``cudastack::closure``, ``cudastack::scan[bin/app]``), taken out of ``config.args`` before the session
    resolves them: pytest reads every argument as a path, and these name no file (a file or directory named
    ``cudastack`` keeps its argument). The run selects them among its items. Under xdist each worker parses
    the same command line, and so takes the same IDs."""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return ()
    base = config.invocation_params.dir
    named = tuple(
        arg
        for arg in config.args
        if (arg == ITEMS_ROOT or arg.startswith(f"{ITEMS_ROOT}::")) and not (base / ITEMS_ROOT).exists()
    )
    if named:
        config.args[:] = [arg for arg in config.args if arg not in named]
    return named


def _given(config: pytest.Config) -> bool:
    """Whether any option is set on the command line, in the environment or in the ini file (a value pytest
    cannot read counts: resolving it names the option). With none set, the settings are the defaults."""
    for option in options.OPTIONS:
        if not options.is_unset(config.getoption(option.key)) or options.env_value(option, os.environ) is not None:
            return True
        if option.ini is not None:
            try:
                if not options.is_unset(config.getini(option.key)):
                    return True
            except (pytest.UsageError, ValueError):
                return True
    return False


def _run(config: pytest.Config, *, given: bool = False, named: tuple[str, ...] = ()) -> CudaStackRun:
    """The run's state, started on first active use (``session.start``); ``named``: the items the command
    line names by node ID."""
    run = config.stash.get(run_key, None)
    if run is None:
        # lazy: the plugin's one import of its work; an unused plugin imports only pytest, the stdlib and the
        # option table (benchmarks/bench_plugin.py)
        from pytest_cudastack.session import start

        run = config.stash[run_key] = start(config, given=given, named=named)
    return run


# markers --------------------------------------------------------------------------------------------

# A mark this close to one of ours (Levenshtein distance) is taken for a misspelling of it: pytest would only
# warn about an unknown mark, and the test would run with its requirement unchecked.
MARK_TYPO_DISTANCE = 2


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def meant_marker(name: str, registered: Collection[str]) -> str | None:
    """The marker of ours ``name`` misspells (``requires_sonam`` -> ``requires_soname``), or None: ``name`` is
    ours, registered by the user (``markers`` ini lines), or not close to any of ours."""
    if name in MARKERS or name in registered:
        return None
    close = [(edit_distance(name, ours), ours) for ours in MARKERS]
    distance, ours = min(close)
    return ours if distance <= MARK_TYPO_DISTANCE else None


def _registered_markers(config: pytest.Config) -> frozenset[str]:
    """The names of the ``markers`` ini lines (``"name(args): help"``), as pytest's --strict-markers reads them."""
    lines: list[str] = config.getini("markers")
    return frozenset(line.split(":", 1)[0].split("(", 1)[0].strip() for line in lines)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    # A misspelt requires_* mark is a collection error of the collector that made the test, naming the mark
    # meant, as --strict-markers makes an unregistered mark one: a test must not run with its requirement
    # silently unchecked.
    report = yield
    if not report.passed:
        return report
    registered: frozenset[str] | None = None
    typos: dict[str, tuple[str, str]] = {}
    for node in report.result:
        if not isinstance(node, pytest.Item):
            continue
        for mark in node.iter_markers():
            if mark.name in MARKERS or mark.name in typos:
                continue
            if registered is None:
                registered = _registered_markers(collector.config)
            meant = meant_marker(mark.name, registered)
            if meant is not None:
                typos[mark.name] = (meant, node.nodeid)
    if typos:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"cudastack: {nodeid}: unknown marker {name!r}: did you mean {meant}? (if {name} is yours, register "
            f"it in the `markers` ini option)"
            for name, (meant, nodeid) in typos.items()
        )
        report.result = []
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = [m for m in item.iter_markers() if m.name in MARKERS]
    if marks:
        _run(item.config).setup_markers(item, marks)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    run = item.config.stash.get(run_key, None)
    if run is not None:
        run.call_markers(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    run = item.config.stash.get(run_key, None)
    if run is not None:
        run.adjust_report(item, report)
    return report


# fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cuda_stack(pytestconfig: pytest.Config) -> Stack:
    """The CUDA stack of this machine (session-scoped, computed lazily): ``.driver``, ``.wheels``,
    ``.libs``, ``.inventory``, ``.findings(check)``; ``.to_json()`` gives it all as JSON."""
    return _run(pytestconfig).stack


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


# reporting ------------------------------------------------------------------------------------------


def pytest_report_header(config: pytest.Config) -> list[str]:
    # quiet unless an option is active, or -vv (session.CudaStackRun.header)
    if config.stash.get(run_key, None) is None and config.option.verbose < 2:
        return []
    return _run(config).header()

"""``cudastack::container``: the NVIDIA container runtime's start of a deployment image on the declared host
(``--cuda-driver``, ``--cuda-arch``), modelled from libnvidia-container and nvidia-container-toolkit
(``cuda/data/container_runtime.json``, :mod:`pytest_cudastack.cuda.container`):

- each ``NVIDIA_REQUIRE_*`` requirement (a legacy image's ``cuda>=CUDA_VERSION``) is evaluated against the
  host driver and each declared GPU: one the host does not meet stops the container (ERROR, the runtime's
  own "unsatisfied condition" words); one weaker than the CUDA the image's binaries and wheels need lets the
  container start and fail later (WARNING);
- a driver library baked into the image (``libnvidia-ml.so.535.104.05``: written by a build run with the
  NVIDIA runtime, or copied in) whose version is not the host driver's: the runtime mounts the host's beside
  it and the loader may pick either ("Driver/library version mismatch"): ERROR, a WARNING when no host
  driver is declared;
- ``/usr/local/cuda/compat``: the runtime uses it only when its libcuda's major is greater than the host
  driver's, and forward compatibility then works only on the GPUs NVIDIA supports it on (WARNING naming the
  rule); a compat libcuda not newer than the host's that the image's own search reaches anyway
  (``LD_LIBRARY_PATH``) replaces the host's driver: CUDA error 803 (ERROR);
- ``NVIDIA_DRIVER_CAPABILITIES`` without ``compute`` where the image needs CUDA: no libcuda is mounted (ERROR);
- rpm's database is not read (an INFO where the image has one), nor is the version of a Python whose files do
  not say it (an INFO: its wheels' markers are evaluated with this machine's Python's), nor a directory more
  than 64 levels deep in a root directory given as the image (an INFO: the walk's depth cap);
- a stub driver library (``.../stubs/libcuda.so``, soname ``libcuda.so.1``) reachable at run time: through
  ``LD_LIBRARY_PATH`` under its soname, or through an ``ld.so.conf`` directory (``ldconfig``, which the
  runtime runs at start, indexes files by soname): the process gets the stub, not the driver (ERROR).
"""

from __future__ import annotations

import os
import re

from pytest_cudastack.checks.facts import StackView, Target
from pytest_cudastack.cuda.compat import load_compat, min_driver_for_cuda
from pytest_cudastack.cuda.container import (
    HostFacts,
    RuntimeData,
    driver_capabilities,
    evaluate,
    first_term,
    load_runtime,
    required_cuda,
    requirements,
)
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.versions import parse_arch
from pytest_cudastack.dirwalk import MAX_DEPTH, walk_tree
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import DriverUpgrade, Env, Facts, Finding, SearchPath, Severity, manual
from pytest_cudastack.image.pythons import image_pythons
from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.linker.ldcache import read_ld_so_conf

__all__ = ["run"]

CHECK = "container"
_DRIVER_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
_VIRTUAL = frozenset({"proc", "sys", "dev"})  # where a container gets the kernel's file systems: not the image's
_SHOWN_DEEP = 16  # directories not walked named in the INFO's facts (a wide tree at the cap can hold thousands)


def _hosts(driver: DriverInfo) -> list[HostFacts]:
    """The host as the runtime sees it: once per declared GPU arch (its brand unknown), or once without a
    device (arch and brand predicates then hold, as configure.c evaluates them)."""
    version = driver.version
    branch = version is not None and "." not in version
    archs = []
    for arch in driver.archs:
        try:
            cc = parse_arch(arch).cc
        except CudaStackError:
            continue
        archs.append(cc)
    if not archs:
        return [HostFacts(driver.cuda_version, version, "999", "any", branch)]
    return [HostFacts(driver.cuda_version, version, cc, None, branch) for cc in archs]


def _requirement_findings(stack: StackView, image: ImageRoot, data: RuntimeData) -> list[Finding]:
    driver = stack.driver
    out: list[Finding] = []
    reqs = requirements(image.env, data)
    if not driver.present:
        if reqs:
            out.append(
                Finding(
                    CHECK,
                    Severity.INFO,
                    reqs[0][0],
                    f"{reqs[0][0]}={reqs[0][1]} not checked: no host driver is known (pass --cuda-driver=VER)",
                )
            )
        return out
    for variable, expression in reqs:
        results = [evaluate(expression, host) for host in _hosts(driver)]
        if False in results:
            need = required_cuda(expression)
            minimum = min_driver_for_cuda(need) if need else None
            remedies = (
                (DriverUpgrade(minimum, need, why="the first driver that meets the requirement"),) if minimum else ()
            )
            out.append(
                Finding(
                    CHECK,
                    Severity.ERROR,
                    variable,
                    f"the NVIDIA container runtime refuses to start the container: unsatisfied condition: "
                    f"{first_term(expression)} (host driver {driver.version}, CUDA {driver.cuda_version})",
                    cause=f"{variable}={expression} is checked against the host's driver before the container "
                    "starts (nvidia-container-cli, 'requirement error')",
                    remedies=remedies
                    + tuple(manual("or use an image built for the host's CUDA", why="the image states it needs more")),
                    facts=Facts(required=expression, found=f"driver {driver.version} (CUDA {driver.cuda_version})"),
                )
            )
        elif None in results:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARNING,
                    variable,
                    f"{variable}={expression}: whether the runtime starts the container depends on the GPU's "
                    "brand or the driver's exact version, which are not known here",
                    facts=Facts(required=expression, found=f"driver {driver.version}"),
                )
            )
    out.extend(_understated(stack, reqs))
    return out


def _understated(stack: StackView, reqs: tuple[tuple[str, str], ...]) -> list[Finding]:
    """A ``cuda>=`` floor below the CUDA major the image's binaries and wheels need: the container starts on a
    host that cannot run them."""
    out: list[Finding] = []
    needs = [n for inference in stack.inferences for n in inference.needs]
    if not needs:
        return out
    top = max(needs, key=lambda n: (n.major, n.minor or 0))
    for variable, expression in reqs:
        floor = required_cuda(expression)
        if floor is None or int(floor.split(".")[0]) >= top.major:
            continue
        out.append(
            Finding(
                CHECK,
                Severity.WARNING,
                variable,
                f"{variable}={expression} lets the container start on a host whose driver cannot run CUDA "
                f"{top.major}, which {top.subject} needs ({top.evidence})",
                remedies=(Env(variable, f"cuda>={top.version.replace('.x', '.0')}", why="state what the image needs"),),
                facts=Facts(required=f"cuda>={top.major}", found=expression, objects=(top.subject,)),
            )
        )
    return out


def _files(image: ImageRoot) -> tuple[list[str], list[str]]:
    """Every file of the image, as image paths (the layers' record, else a walk of the root: a root directory
    given as the image has no record), and the image paths of the directories the walk did not enter, deeper
    than ``MAX_DEPTH`` levels (:func:`~pytest_cudastack.dirwalk.walk_tree`: an image's tree may be any depth,
    and is walked without recursion)."""
    if image.owner:
        return ["/" + p for p in image.owner], []
    out: list[str] = []
    deep: list[str] = []
    for level in walk_tree(image.root, skip=lambda parent, name: parent == image.root and name in _VIRTUAL):
        logical = image.image_path(level.path) or "/"
        out.extend(os.path.join(logical, n) for n in level.files)
        deep.extend(image.image_path(d) or d for d in level.deep)
    return out, deep


def _baked(files: list[str], driver: DriverInfo, data: RuntimeData) -> list[Finding]:
    out: list[Finding] = []
    libs = data.driver_libraries
    for path in sorted(files):
        name = os.path.basename(path)
        lib = next((lib for lib in libs if name.startswith(lib + ".")), None)
        version = name[len(lib) + 1 :] if lib else ""
        if lib is None or not _DRIVER_VERSION.fullmatch(version) or path.startswith(data.compat_dir + "/"):
            continue
        if "/stubs/" in path:
            continue
        host = driver.version
        same = host is not None and (version == host or ("." not in host and version.split(".")[0] == host))
        if same:
            continue
        severity = Severity.ERROR if host is not None else Severity.WARNING
        against = f"the host's driver is {host}" if host else "no host driver is declared (--cuda-driver)"
        out.append(
            Finding(
                CHECK,
                severity,
                path,
                f"driver library {name} is baked into the image; {against}",
                cause="the NVIDIA runtime mounts the host's driver libraries into the container and runs ldconfig; "
                "a driver library of another version beside them can be the one loaded, and a user-space driver "
                "library must match the kernel module exactly ('Failed to initialize NVML: Driver/library version "
                "mismatch', CUDA error 803)",
                remedies=manual(
                    f"delete {path} in the step that adds it, or build the image without the NVIDIA runtime as "
                    "Docker's default runtime"
                ),
                facts=Facts(required=f"driver {host}" if host else "", found=version, objects=(path,)),
            )
        )
    return out


def _compat(stack: StackView, image: ImageRoot, data: RuntimeData, files: list[str]) -> list[Finding]:
    out: list[Finding] = []
    driver = stack.driver
    host_major = int(driver.version.split(".")[0]) if driver.version and driver.version[:1].isdigit() else None
    prefix = data.compat_library + "."
    for path in sorted(p for p in files if os.path.dirname(p) == data.compat_dir):
        version = os.path.basename(path)[len(prefix) :] if os.path.basename(path).startswith(prefix) else ""
        if not _DRIVER_VERSION.fullmatch(version) or host_major is None:
            continue
        major = int(version.split(".")[0])
        if major > host_major:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARNING,
                    path,
                    f"the runtime uses this forward-compatibility libcuda {version} on the host's driver "
                    f"{driver.version}: it works only where NVIDIA supports forward compatibility",
                    cause=load_compat().forward_compat_rule + "; elsewhere CUDA fails with error 804",
                    facts=Facts(found=version, required=f"driver {driver.version}", objects=(path,)),
                )
            )
            continue
        how = _compat_route(image, data)
        if how is None:
            continue
        on_path = how == "LD_LIBRARY_PATH"
        out.append(
            Finding(
                CHECK,
                Severity.ERROR if on_path else Severity.WARNING,
                path,
                f"compat libcuda {version} is not newer than the host's driver {driver.version}, yet the image's "
                f"own search {'loads' if on_path else 'may load'} it ({how}): CUDA then fails with error 803",
                cause="the runtime leaves compat libraries out when the host driver is as new (compat_mode.c); "
                + (
                    "LD_LIBRARY_PATH is searched before the directory the host's driver is mounted in"
                    if on_path
                    else "ldconfig indexes the compat libcuda.so.1 beside the host's; which one the cache maps "
                    "depends on the order of its directories"
                ),
                remedies=(SearchPath(data.compat_dir, how, why="the host's driver is as new: no compat libcuda"),),
                facts=Facts(found=version, required=f"driver {driver.version}", objects=(path,)),
            )
        )
    return out


def _compat_route(image: ImageRoot, data: RuntimeData) -> str | None:
    """How the image's own search reaches the compat directory's ``libcuda.so.1``: ``LD_LIBRARY_PATH``,
    ``ld.so.conf``, or None."""
    if not os.path.lexists(image.host(os.path.join(data.compat_dir, "libcuda.so.1"))):
        return None
    llp = [os.path.normpath(d) for d in image.env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    if data.compat_dir in llp:
        return "LD_LIBRARY_PATH"
    conf = [os.path.normpath(d) for d in read_ld_so_conf("/etc/ld.so.conf", root=image.root)]
    return "ld.so.conf" if data.compat_dir in conf else None


def _stubs(stack: StackView, image: ImageRoot) -> list[Finding]:
    """A stub driver library reachable at run time: by soname in an ``LD_LIBRARY_PATH`` directory, or in an
    ``ld.so.conf`` directory (ldconfig maps its soname to it)."""
    out: list[Finding] = []
    llp = [d for d in image.env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    conf = list(read_ld_so_conf("/etc/ld.so.conf", root=image.root))
    seen: set[str] = set()
    for how, dirs in (("LD_LIBRARY_PATH", llp), ("ld.so.conf", conf)):
        for d in dirs:
            try:
                names = sorted(os.listdir(image.host(d)))
            except OSError:
                continue
            for name in names:
                path = os.path.join(d, name)
                real = os.path.realpath(image.host(path))
                if "/stubs/" not in (image.image_path(real) or "") + "/" or real in seen:
                    continue
                try:
                    soname = stack.cache.read(real).soname
                except CudaStackError:
                    continue
                if soname is None or not soname.startswith(("libcuda.so", "libnvidia-ml.so")):
                    continue
                if how == "LD_LIBRARY_PATH" and name != soname:
                    continue  # ld.so looks a DT_NEEDED up by file name there
                seen.add(real)
                out.append(
                    Finding(
                        CHECK,
                        Severity.ERROR,
                        path,
                        f"stub {soname} is reachable at run time through {how} ({d}): the process loads the stub, "
                        "not the host's driver, and finds no GPU (CUDA_ERROR_STUB_LIBRARY)",
                        cause="stub libraries are for linking only; "
                        + (
                            "ld.so searches LD_LIBRARY_PATH before the driver's directory"
                            if how == "LD_LIBRARY_PATH"
                            else "ldconfig, which the runtime runs at start, maps a library's soname to it in "
                            "every ld.so.conf directory"
                        ),
                        remedies=(SearchPath(d, how, why=f"stubs are for linking only (-L{d} at build time)"),),
                        facts=Facts(found=path, sonames=(soname,), objects=(path,)),
                    )
                )
    return out


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``container`` item's findings (module docstring); none for this machine."""
    image = stack.image
    if image is None:
        return ()
    data = load_runtime()
    out = _requirement_findings(stack, image, data)
    files, deep = _files(image)  # one walk of an unrecorded root for both questions
    out += _baked(files, stack.driver, data)
    out += _compat(stack, image, data, files)
    out += _stubs(stack, image)
    out += _capabilities(stack, image, data)
    out += _unread_databases(image)
    out += _unwalked(deep)
    out += _unknown_pythons(image)
    return tuple(out)


def _capabilities(stack: StackView, image: ImageRoot, data: RuntimeData) -> list[Finding]:
    """``NVIDIA_DRIVER_CAPABILITIES`` without ``compute`` (nor ``all``) in an image whose binaries or wheels
    need CUDA: the runtime mounts no libcuda, and the CUDA they load finds no driver."""
    caps = driver_capabilities(image.env, data)
    if caps is None or "compute" in caps:
        return []
    needs = [n for inference in stack.inferences for n in inference.needs]
    if not needs:
        return []
    compute = [lib for lib, cap in data.library_capability if cap == "compute"]
    value = image.env.get(data.capabilities_variable, "")
    return [
        Finding(
            CHECK,
            Severity.ERROR,
            data.capabilities_variable,
            f"{data.capabilities_variable}={value} leaves out compute: the runtime mounts none of "
            f"{', '.join(compute[:3])}, ..., and {needs[0].subject} needs CUDA ({needs[0].evidence})",
            cause="the NVIDIA runtime mounts a driver library only for a capability the image asks for",
            remedies=(Env(data.capabilities_variable, ",".join(sorted({*caps, "compute"})), why="mount libcuda"),),
            facts=Facts(required="compute", found=value, objects=(needs[0].subject,)),
        )
    ]


def _unread_databases(image: ImageRoot) -> list[Finding]:
    """An INFO per OS package database this check does not read (rpm's): what it installed is judged as the
    image's own files (its binaries scanned, its libraries owned by no package)."""
    return [
        Finding(
            CHECK,
            Severity.INFO,
            path,
            "rpm's package database is not read: files an rpm installed are judged as the image's own",
        )
        for path in ("/var/lib/rpm", "/usr/lib/sysimage/rpm")
        if os.path.isdir(image.host(path))
    ][:1]


def _unwalked(deep: list[str]) -> list[Finding]:
    """One INFO when the walk of the image's root left directories out (deeper than ``MAX_DEPTH`` levels): a
    driver library baked there is not looked for, as the files of an unread package database are not."""
    if not deep:
        return []
    some = f"{len(deep)} director{'y' if len(deep) == 1 else 'ies'}"
    return [
        Finding(
            CHECK,
            Severity.INFO,
            deep[0],
            f"{some} more than {MAX_DEPTH} levels below / {'is' if len(deep) == 1 else 'are'} not walked (the "
            "walk's depth cap): a driver library baked there is not looked for",
            facts=Facts(objects=tuple(deep[:_SHOWN_DEEP])),
        )
    ]


def _unknown_pythons(image: ImageRoot) -> list[Finding]:
    """An INFO per Python on the image's ``PATH`` whose version its files do not say
    (:func:`~pytest_cudastack.image.pythons.installation_version`): said, not guessed."""
    return [
        Finding(
            CHECK,
            Severity.INFO,
            python.path,
            f"the version of the Python at {python.path} cannot be read from its files (no python3.X name "
            "along its links, no libpython3.X it links, no pyvenv.cfg version, not one lib/python3.X/os.py): "
            "its site directories are those of every lib/python3.X of its prefix, and a version-less one's "
            "(/usr/lib/python3/dist-packages) markers and extension suffixes are this machine's Python's",
            facts=Facts(objects=(python.path,)),
        )
        for python in image_pythons(image)
        if python.version is None
    ]

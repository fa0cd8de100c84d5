from __future__ import annotations

import os

import pytest

from pytest_cudastack.cuda.driver import DriverInfo, Gpu
from pytest_cudastack.errors import RuleError
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.resolver import Library, Route
from pytest_cudastack.markers import (
    REASON_PARTS,
    REASON_WIDTH,
    MarkerCall,
    Unmet,
    check_marker,
    evaluate,
    evaluate_all,
    short_reason,
)
from pytest_cudastack.wheels.inventory import Inventory
from pytest_cudastack.wheels.requirements import requirement_facts


class Facts:
    """Fake stack facts: sonames found at given paths, an inventory, integrity findings, a driver."""

    def __init__(
        self,
        found: dict[str, str] | None = None,
        inventory: Inventory | None = None,
        integrity: tuple[Finding, ...] = (),
        driver: DriverInfo | None = None,
    ) -> None:
        self.found = found or {}
        self.inventory = inventory or Inventory((), ("/site",), ())
        self.integrity = integrity
        self.requirements = requirement_facts(self.inventory)
        self.driver = driver or DriverInfo("absent", None, None, reason="no NVML")

    def find(self, soname: str) -> Library:
        path = self.found.get(soname)
        tried = () if path else (f"/usr/lib64/{soname}", f"/lib64/{soname}")
        return Library(soname, path, path, Route.LD_CACHE if path else Route.NOT_FOUND, "", tried, ("/py",))


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "message"),
    [
        pytest.param("requires_soname", (), {}, "needs at least one soname", id="soname empty"),
        pytest.param("requires_soname", (5,), {}, "expected strings", id="soname int"),
        pytest.param("requires_soname", ("libx",), {}, "not a soname", id="soname no .so"),
        pytest.param("requires_soname", ("libx.so.1",), {"reason": "x"}, "unexpected keyword", id="soname kwarg"),
        pytest.param("requires_wheel", (), {}, "needs at least one requirement", id="wheel empty"),
        pytest.param("requires_wheel", ("torch>>2",), {}, "invalid PEP 508", id="wheel bad"),
        pytest.param("requires_driver", (), {}, "exactly one specifier", id="driver empty"),
        pytest.param("requires_driver", (">=550", ">=560"), {}, "exactly one specifier", id="driver two"),
        pytest.param("requires_driver", (550,), {}, "expected a specifier string", id="driver int"),
        pytest.param("requires_driver", ("~~550",), {}, "invalid driver version specifier", id="driver bad"),
        pytest.param("requires_cuda", ("twelve",), {}, "invalid CUDA version specifier", id="cuda bad"),
        pytest.param("requires_driver", (">=12.4",), {}, "invalid NVIDIA driver version '12.4'", id="driver as cuda"),
        pytest.param("requires_cuda", (">=550",), {}, "invalid CUDA version '550'", id="cuda as driver"),
        pytest.param("requires_gpu", (), {"arch": "sm_9"}, "invalid GPU architecture 'sm_9'", id="gpu arch sm_9"),
        pytest.param("requires_gpu", (), {"count": -1}, "non-negative integer", id="gpu count"),
        pytest.param("requires_gpu", (), {"arch": "hopper"}, "invalid arch", id="gpu arch"),
        pytest.param("requires_gpu", (), {"memory": "lots"}, "invalid memory", id="gpu memory"),
        pytest.param("requires_gpu", (1, None, None, 4), {}, "signature is", id="gpu too many"),
        pytest.param("requires_gpu", (1,), {"count": 2}, "count given twice", id="gpu twice"),
    ],
)
def test_misuse_raises_rule_error(name, args, kwargs, message):
    with pytest.raises(RuleError, match=message):
        check_marker(name, args, kwargs)


def test_check_marker_normalises():
    assert check_marker("requires_gpu", (2,), {"arch": "sm_90"}) == MarkerCall("requires_gpu", (2, "sm_90", None))
    assert check_marker("requires_cuda", (), {"spec": ">=12.4"}) == MarkerCall("requires_cuda", (">=12.4",))
    assert str(MarkerCall("requires_soname", ("a.so.1",))) == "requires_soname('a.so.1')"


def test_soname_found_by_linker():
    facts = Facts(found={"libcudnn.so.9": "/usr/lib/libcudnn.so.9"})
    assert evaluate(MarkerCall("requires_soname", ("libcudnn.so.9",)), facts) is None


def test_soname_missing_lists_every_place_and_all_missing_at_once():
    unmet = evaluate(MarkerCall("requires_soname", ("liba.so.1", "libc.so.6", "libb.so.2")), Facts({"libc.so.6": "/x"}))
    assert isinstance(unmet, Unmet)
    assert unmet.marker == "requires_soname"
    assert (
        "liba.so.1 not found by the dynamic linker (looked in: /usr/lib64/liba.so.1, /lib64/liba.so.1)" in unmet.reason
    )
    assert "libb.so.2 not found" in unmet.reason
    assert "libc.so.6" not in unmet.reason.split("unmet:")[1]


def test_soname_shipped_by_wheel(tmp_path):
    from tests.helpers.sitebuild import HAVE_CC, compile_so, write_dist

    if not HAVE_CC:
        pytest.skip("needs a C compiler")
    from pytest_cudastack.wheels.inventory import installed_wheels

    write_dist(tmp_path, "nvidia-x-cu12", "12.1", {"nvidia/x/lib/libx.so.12": compile_so("libx.so.12")})
    write_dist(tmp_path, "nvidia-y-cu12", "9.0", {"nvidia/y/lib/liby.so.9": compile_so("liby.so.9")}, write_files=False)
    facts = Facts(inventory=installed_wheels([str(tmp_path)]))
    assert evaluate(MarkerCall("requires_soname", ("libx.so.12",)), facts) is None
    unmet = evaluate(MarkerCall("requires_soname", ("liby.so.9",)), facts)
    assert unmet is not None
    path = os.path.join(tmp_path, "nvidia/y/lib/liby.so.9")
    assert f"nvidia-y-cu12 9.0 claims it at {path} but the file is missing" in unmet.reason


def test_wheel_integrity_error_makes_it_not_intact(tmp_path):
    from pytest_cudastack.wheels.inventory import installed_wheels
    from tests.helpers.sitebuild import write_dist

    write_dist(tmp_path, "nvidia-nccl-cu12", "2.20.5", {"nvidia/nccl/include/nccl.h": "x"})
    inv = installed_wheels([str(tmp_path)])
    bad = Finding(
        "integrity",
        Severity.ERROR,
        "nvidia-nccl-cu12 2.20.5",
        "libnccl.so.2 has other bytes",
        distributions=("nvidia-nccl-cu12",),
    )
    other = Finding("integrity", Severity.ERROR, "nvidia-nccl-cu12 2.20.5", "unrelated", distributions=("torch",))
    call = MarkerCall("requires_wheel", ("nvidia-nccl-cu12>=2",))
    assert evaluate(call, Facts(inventory=inv)) is None
    assert evaluate(call, Facts(inventory=inv, integrity=(other,))) is None  # the subject text decides nothing
    unmet = evaluate(call, Facts(inventory=inv, integrity=(bad,)))
    assert unmet is not None
    assert "not intact: libnccl.so.2 has other bytes" in unmet.reason


DRIVER = DriverInfo(
    "probed", "550.54.15", "12.4", (Gpu(0, "NVIDIA A100", None, "8.0", 40 * 2**30, None),), ("sm_80",), "probed"
)


@pytest.mark.parametrize(
    ("call", "met"),
    [
        pytest.param(MarkerCall("requires_driver", (">=550",)), True, id="driver met"),
        pytest.param(MarkerCall("requires_driver", (">=580",)), False, id="driver unmet"),
        pytest.param(MarkerCall("requires_cuda", (">=12.4",)), True, id="cuda met"),
        pytest.param(MarkerCall("requires_cuda", (">=12.8",)), False, id="cuda unmet"),
        pytest.param(MarkerCall("requires_gpu", (1, ">=8.0", 2**30)), True, id="gpu met"),
        pytest.param(MarkerCall("requires_gpu", (1, "sm_90", None)), False, id="gpu arch unmet"),
        pytest.param(MarkerCall("requires_gpu", (2, None, None)), False, id="gpu count unmet"),
    ],
)
def test_driver_markers(call, met):
    unmet = evaluate(call, Facts(driver=DRIVER))
    assert (unmet is None) is met
    if unmet is not None:
        assert unmet.reason.startswith(f"cudastack: {call} unmet: ")


def test_evaluate_all_reports_every_unmet_marker():
    calls = [MarkerCall("requires_driver", (">=580",)), MarkerCall("requires_soname", ("libq.so.1",))]
    unmet = evaluate_all(calls, Facts(driver=DRIVER))
    assert unmet is not None
    assert unmet.marker == "requires_driver,requires_soname"
    assert len(unmet.reason.splitlines()) == 2
    assert evaluate_all([], Facts()) is None


def test_marker_evaluation_through_pytester_getitem(pytester):
    from pytest_cudastack.markers import check_marker as check

    item = pytester.getitem(
        """
        import pytest

        @pytest.mark.requires_cuda(">=13.0")
        def test_func():
            pass
        """
    )
    calls = [check(m.name, m.args, m.kwargs) for m in item.iter_markers() if m.name.startswith("requires_")]
    unmet = evaluate_all(calls, Facts(driver=DRIVER))
    assert unmet is not None
    assert "supports CUDA <= 12.4; requires >=13.0" in unmet.reason


def test_shared_file_finding_names_both_distributions(tmp_path):
    from pytest_cudastack.wheels.inventory import installed_wheels
    from tests.helpers.sitebuild import write_dist

    write_dist(tmp_path, "nvidia-cudnn-cu12", "9.19.0.56", {"nvidia/cudnn/include/cudnn.h": "x"})
    inv = installed_wheels([str(tmp_path)])
    shared = Finding(
        "integrity",
        Severity.ERROR,
        "nvidia-cudnn-cu13 / nvidia-cudnn-cu12",
        "same files",
        distributions=("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"),
    )
    unmet = evaluate(MarkerCall("requires_wheel", ("nvidia-cudnn-cu12",)), Facts(inventory=inv, integrity=(shared,)))
    assert unmet is not None
    assert "not intact: same files" in unmet.reason


# -- reprs, reasons for a terminal ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "shown"),
    [
        pytest.param("requires_gpu", (), {}, "requires_gpu(count=1)", id="gpu default"),
        pytest.param("requires_gpu", (2,), {"memory": "40GiB"}, "requires_gpu(count=2, memory='40GiB')", id="gpu"),
        pytest.param("requires_gpu", (1, "sm_90"), {}, "requires_gpu(count=1, arch='sm_90')", id="gpu arch"),
        pytest.param("requires_soname", ("libcudnn.so.9",), {}, "requires_soname('libcudnn.so.9')", id="soname"),
        pytest.param("requires_wheel", ("a", "b>=1"), {}, "requires_wheel('a', 'b>=1')", id="wheel"),
        pytest.param("requires_driver", (), {"spec": ">=550"}, "requires_driver('>=550')", id="driver"),
        pytest.param("requires_cuda", (">=12.4",), {}, "requires_cuda('>=12.4')", id="cuda"),
    ],
)
def test_marker_call_reads_like_the_call(name, args, kwargs, shown):
    assert str(check_marker(name, args, kwargs)) == shown


@pytest.mark.parametrize(
    ("reason", "short"),
    [
        pytest.param(
            "nvmlInit: the NVML library libnvidia-ml.so.1 was not found (no NVIDIA driver installed) "
            "(NVML_ERROR_LIBRARY_NOT_FOUND)",
            "no libnvidia-ml.so.1",
            id="no NVML",
        ),
        pytest.param(
            "nvmlInit: the NVIDIA kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED)",
            "nvmlInit: the NVIDIA kernel driver is not loaded",
            id="driver not loaded",
        ),
        pytest.param("no NVML", "no NVML", id="short already"),
        pytest.param(None, "unknown", id="none"),
        pytest.param("x" * 100, "x" * 57 + "...", id="capped"),
    ],
)
def test_short_reason(reason, short):
    assert short_reason(reason) == short


def test_no_driver_reason_is_short_in_every_driver_marker():
    long = "nvmlInit: the NVML library libnvidia-ml.so.1 was not found (x) (NVML_ERROR_LIBRARY_NOT_FOUND)"
    facts = Facts(driver=DriverInfo("absent", None, None, reason=long))
    calls = [MarkerCall("requires_driver", (">=550",)), MarkerCall("requires_cuda", (">=12",))]
    unmet = evaluate_all([*calls, MarkerCall("requires_gpu", (1, None, None))], facts)
    assert unmet is not None
    assert "NVML_ERROR" not in unmet.reason
    assert unmet.reason.count("(no libnvidia-ml.so.1)") == 3


def test_short_reason_stays_one_line():
    unmet = Unmet("requires_cuda", "cudastack: requires_cuda('>=13') unmet: driver 550 supports CUDA <= 12.4; x")
    assert unmet.render() == unmet.reason


def test_long_reason_wrapped_into_parts_and_capped_below_v():
    parts = [f"/site/nvidia/cudnn/lib/libcudnn_{i}.so.9 (listed in RECORD) is missing " + "y" * 60 for i in range(10)]
    unmet = Unmet("requires_wheel", "cudastack: requires_wheel('nvidia-cudnn-cu12') unmet: " + "; ".join(parts))
    lines = unmet.render().splitlines()
    assert lines[0] == "cudastack: requires_wheel('nvidia-cudnn-cu12') unmet:"
    assert lines[-1] == f"  ... {10 - (REASON_PARTS - 1)} more (-v)"
    assert all(len(line) <= REASON_WIDTH for line in lines)
    assert sum(line.startswith("  /site/") for line in lines) == REASON_PARTS - 1
    full = unmet.render(verbose=1).splitlines()
    assert sum(line.startswith("  /site/") for line in full) == 10
    assert "more (-v)" not in unmet.render(verbose=1)

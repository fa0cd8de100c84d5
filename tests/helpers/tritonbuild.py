"""Stand-ins for triton's driver lookup as two of its releases write it (tests/test_driverlookup.py, the image
tests): 3.x (``backends/nvidia/driver.py``, the variable behind a knob in ``knobs.py``, matching and asserting
``libcuda.so.1``) and 2.x (``common/build.py``, ``os.getenv``, the unversioned ``libcuda.so``)."""

from __future__ import annotations

__all__ = ["BUILD_2X", "DRIVER_3X", "KNOBS_3X"]

DRIVER_3X = """\
import functools
import os
import subprocess

from triton import knobs


@functools.lru_cache()
def libcuda_dirs():
    if env_libcuda_path := knobs.nvidia.libcuda_path:
        return [env_libcuda_path]

    libs = subprocess.check_output(["/sbin/ldconfig", "-p"]).decode(errors="ignore")
    locs = [line.split()[-1] for line in libs.splitlines() if "libcuda.so.1" in line]
    dirs = [os.path.dirname(loc) for loc in locs]
    env_ld_library_path = os.getenv("LD_LIBRARY_PATH")
    if env_ld_library_path and not dirs:
        dirs = [dir for dir in env_ld_library_path.split(":") if os.path.exists(os.path.join(dir, "libcuda.so.1"))]
    msg = 'libcuda.so cannot found!\\n'
    if locs:
        msg += 'Possible files are located at %s.' % str(locs)
    assert any(os.path.exists(os.path.join(path, 'libcuda.so.1')) for path in dirs), msg
    return dirs
"""
KNOBS_3X = """\
class nvidia_knobs:
    libcuda_path: env_opt_str = env_opt_str("TRITON_LIBCUDA_PATH")
"""
BUILD_2X = """\
import functools
import os
import subprocess


@functools.lru_cache()
def libcuda_dirs():
    env_libcuda_path = os.getenv("TRITON_LIBCUDA_PATH")
    if env_libcuda_path:
        return [env_libcuda_path]
    libs = subprocess.check_output(["/sbin/ldconfig", "-p"]).decode()
    locs = [line.split()[-1] for line in libs.splitlines() if "libcuda.so" in line]
    dirs = [os.path.dirname(loc) for loc in locs]
    msg = 'libcuda.so cannot found!\\n'
    assert any(os.path.exists(os.path.join(path, 'libcuda.so')) for path in dirs), msg
    return dirs
"""

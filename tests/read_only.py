"""A directory this process cannot create files in, for tests of unwritable outputs, also
where the tests run as root (a container's CI, this machine).

Root writes into a mode-0555 directory (CAP_DAC_OVERRIDE), so the permission bits alone make
no unwritable place there. `unwritable_directory` also drops CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH from the calling thread's effective capabilities while the block runs
(capset(2): capabilities are per thread on Linux, and they stay in the permitted set, so
they are raised again afterwards): the kernel then refuses the writes as it refuses an
ordinary account's. Code under test runs in this thread (a tool's `main` in-process,
tests/cli_harness.py). Where capabilities cannot be set (not Linux), a test run as root is
skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

import pytest

_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
_DAC = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def _without_dac_override():
    """The calling thread without the capabilities that let root write anywhere."""
    if os.geteuid() != 0:
        yield
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        capget, capset = libc.capget, libc.capset
    except (OSError, AttributeError):
        pytest.skip("runs as root, and capabilities cannot be dropped here (not Linux)")
    header = _Header(_VERSION_3, 0)  # pid 0: the calling thread
    data = (_Data * 2)()
    if capget(ctypes.byref(header), data) != 0:
        pytest.skip(f"capget failed: {os.strerror(ctypes.get_errno())}")
    effective = data[0].effective
    data[0].effective = effective & ~_DAC
    if capset(ctypes.byref(header), data) != 0:
        pytest.skip(f"capset failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        data[0].effective = effective
        if capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "could not restore this thread's capabilities")


@contextlib.contextmanager
def unwritable_directory(path):
    """`path` (an existing directory) as mode 0555, and this thread unable to write into
    it, while the block runs; its mode is restored afterwards."""
    mode = os.stat(path).st_mode & 0o7777
    os.chmod(path, 0o555)
    try:
        with _without_dac_override():
            yield path
    finally:
        os.chmod(path, mode)

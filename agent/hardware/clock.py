"""Is the system clock synchronised? Signed commands are judged against it (docs/security.md),
so a device whose clock drifted refuses its operator.

Two readers, the first that knows wins:

1. systemd-timesyncd's flag file ``/run/systemd/timesync/synchronized`` (under the `SysFS`
   root), which it creates once it synchronised the clock since boot;
2. the kernel's own NTP state, asked through ``adjtimex`` with no change requested (read
   only): synchronised when ``STA_UNSYNC`` is clear and the maximum error is under 16 s, the
   test ``timedatectl`` applies. Any NTP daemon (chrony, ntpd, timesyncd) clears the flag.

None means unknown: no flag file and ``adjtimex`` refused (the hardened systemd unit filters the
``@clock`` system calls). Stateless; any thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

from agent.hardware.sysfs import SysFS

TIMESYNCD_FLAG = "run/systemd/timesync/synchronized"
STA_UNSYNC = 0x0040  # <linux/timex.h>: the clock is not synchronised
MAX_ERROR_US = 16_000_000  # systemd's ntp_synced(): a larger maximum error is not synchronised


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """``struct timex`` of <sys/timex.h> (Linux, glibc and musl, 32 and 64 bit)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("reserved", ctypes.c_int * 11),
    ]


KernelNtp = Callable[[], tuple[int, int]]


def kernel_ntp_state() -> tuple[int, int]:
    """The kernel clock's ``(status bits, maximum error in µs)``; raises `OSError` when the
    call is refused (a seccomp filter) or this is not Linux."""
    name = ctypes.util.find_library("c")
    if name is None:
        raise OSError("no C library to ask adjtimex")
    libc = ctypes.CDLL(name, use_errno=True)
    timex = _Timex()  # modes = 0: read only, needs no privilege
    if libc.adjtimex(ctypes.byref(timex)) == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, f"adjtimex: {os.strerror(errno)}")
    return int(timex.status), int(timex.maxerror)


def clock_synchronised(fs: SysFS, kernel: KernelNtp = kernel_ntp_state) -> bool | None:
    """True when the clock is synchronised, False when the kernel says it is not, None when
    unknown. `kernel` is the adjtimex seam (tests pass their own)."""
    if fs.path(TIMESYNCD_FLAG).exists():
        return True
    try:
        status, max_error_us = kernel()
    except OSError:
        return None
    return not status & STA_UNSYNC and max_error_us < MAX_ERROR_US

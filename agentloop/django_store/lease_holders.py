"""Who holds a lease: this process as a holder, and whether another holder still runs.

A holder is ``"<host>/<boot>:<pid>:<start time>"``: the host's name and, on Linux, its boot
(a pid means nothing after a reboot), the process id, and the process's start time (so a pid
the kernel gave to another process since doesn't pass for the holder). Only a holder on this
host can be judged; elsewhere the lease's expiry tells.
"""

from __future__ import annotations

import os
import socket

__all__ = ["holder_alive", "holder_id"]

_IDENTITY: tuple[int, str] = (0, "")


def holder_id() -> str:
    """This process as a lease holder: ``"<host>/<boot>:<pid>:<start time>"``."""
    global _IDENTITY
    pid = os.getpid()
    if _IDENTITY[0] != pid:  # computed once per process (a forked child is a new holder)
        _IDENTITY = (pid, f"{_host()}:{pid}:{_started(pid) or ''}")
    return _IDENTITY[1]


def _host() -> str:
    """This host: its name and, on Linux, its boot (a pid means nothing after a reboot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()[:8]
    except OSError:
        boot = ""
    name = socket.gethostname()[:180]
    return f"{name}/{boot}" if boot else name


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the process state on (field 3), or None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot; Linux), None where that can't be read."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def holder_alive(holder: str) -> bool | None:
    """Whether the process named by ``holder`` (see :func:`holder_id`) still runs: None when
    this host can't tell (another host, or a holder written by an older version)."""
    try:
        host, pid_text, started = holder.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != _host():
        return None  # another host: only the lease's expiry tells
    if os.path.isdir("/proc/self"):
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X", "x"):
            return False  # gone, or a zombie nobody reaped yet
        # The pid names another process now when it started at another time.
        return not started or (len(fields) > 19 and fields[19] == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

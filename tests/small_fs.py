"""A real small file system for tests: a tmpfs mounted (and unmounted) by the test itself.

Mounted through mount(2) directly, so that no `mount` binary is needed; where this user may
not mount (not root, or a container without CAP_SYS_ADMIN) the test is skipped with the reason.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_MS_RDONLY, _MS_REMOUNT, _MNT_DETACH = 1, 32, 2


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    return libc


class SmallFs:
    """tmpfs mounts made by one test; `unmount_all` undoes them."""

    def __init__(self, root: Path) -> None:
        self.root, self.mounts = root, []

    def mount(self, name: str = "fs", size: str = "2m") -> Path:
        """A fresh tmpfs of `size` bytes (k/m suffixes allowed) at root/name."""
        target = self.root / name
        target.mkdir(parents=True, exist_ok=True)
        if _libc().mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, f"size={size},mode=0755".encode()) != 0:
            code = ctypes.get_errno()
            pytest.skip(f"cannot mount a tmpfs at {target}: {os.strerror(code)} (needs root or CAP_SYS_ADMIN)")
        self.mounts.append(target)
        return target

    def read_only(self, target: Path, read_only: bool = True) -> None:
        """Remount `target` read-only (or writable again)."""
        flags = _MS_REMOUNT | (_MS_RDONLY if read_only else 0)
        if _libc().mount(b"tmpfs", str(target).encode(), b"tmpfs", flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"cannot remount {target}")

    def unmount_all(self) -> None:
        for target in reversed(self.mounts):
            _libc().umount2(str(target).encode(), _MNT_DETACH)
        self.mounts.clear()


def fill(directory: Path, name: str = "filler", leave: int = 0) -> Path:
    """Write a file into `directory` until its file system has at most `leave` bytes free."""
    path = directory / name
    with open(path, "ab") as f:
        while True:
            free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
            if free <= leave:
                break
            try:
                f.write(b"\0" * min(free - leave, 1 << 16))
                f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    return path


@contextmanager
def small_fs(root: Path) -> Iterator[SmallFs]:
    """A SmallFs under `root` whose mounts are undone on leaving (a test's fixture wraps it)."""
    fs = SmallFs(root)
    try:
        yield fs
    finally:
        fs.unmount_all()

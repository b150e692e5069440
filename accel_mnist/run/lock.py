"""One live run per output directory: an operating-system lock, and a lease where the lock
may not reach.

The main process of a run holds `flock` on `<output_dir>/.accel_mnist.lock` for as long as
the run lives. The kernel drops it when the process ends, however it ends (SIGKILL, a crash,
the out-of-memory killer), so a run that died never blocks the next `--resume-from auto`.

flock holds on one machine whatever the file system. Across machines it holds on NFS, where
Linux takes it as a byte-range lock on the server, unless the client mounts with
`local_lock=flock` or `local_lock=all`; on Lustre only with `-o flock` (`-o localflock` keeps
it on each node). Where it does not, the lease does: `.accel_mnist.lease.json` names the
holder (host, pid, start) and the live run rewrites it every RENEW_SECONDS. A run that gets
the lock but finds another machine's lease watches it: rewritten meanwhile, its run is alive
and this one stops; unchanged for STALE_SECONDS, its run is dead and this one takes over. A
lease of this machine is settled by the lock: whoever wrote it no longer holds the lock.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..caller import setting
from ..errors import UsageError
from ..files import read_json_if_valid, write_json_atomic, writing

LOCK_FILE = ".accel_mnist.lock"
LEASE_FILE = ".accel_mnist.lease.json"
RENEW_SECONDS = 10.0
STALE_SECONDS = 45.0
# A lease last written longer ago than this, by this machine's clock, is stale without being
# watched: far beyond any clock skew between the machines of one cluster.
OLD_SECONDS = 600.0
# flock refused by the file system itself rather than by another holder.
_NO_FLOCK = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})
logger = logging.getLogger(__name__)


@dataclass
class Lease:
    """Who holds a directory, as its lease file says."""

    host: str
    pid: int
    started: float
    renewed: float
    count: int = 0
    token: str = ""
    command: str = ""

    @classmethod
    def read(cls, path: Path) -> Lease | None:
        data = read_json_if_valid(path)
        try:
            return cls(**data) if data else None
        except TypeError:  # not one of ours, or from another version: no holder named
            return None

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        age = max(0.0, time.time() - self.renewed)
        return f"pid {self.pid} on host {self.host}, started {started}, lease renewed {age:.0f} s ago"


class RunLock:
    """The lock and lease of one output directory, held by the main process of a run."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.lock_path, self.lease_path = directory / LOCK_FILE, directory / LEASE_FILE
        self.fd: int | None = None
        self.lease: Lease | None = None
        self._warned = False

    def acquire(self) -> None:
        """Take the directory (creating it), or raise UsageError naming the run that holds it;
        a StorageError where the directory cannot be written. Nothing is written before the
        lock is ours."""
        with writing("the output directory", self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        os_lock = self._lock()
        held = Lease.read(self.lease_path)
        if held is not None:
            live = self._live_holder(held, os_lock)
            if live is not None:
                self._close()
                raise self._in_use(live)
            logger.info(f"{self.dir}: the lease of {held.describe()} is stale; taking it over")
        now = time.time()
        command = " ".join(sys.argv)[:500]  # for a person reading the file
        self.lease = Lease(socket.gethostname(), os.getpid(), now, now, 0, secrets.token_hex(8), command)
        try:
            write_json_atomic(self.lease_path, asdict(self.lease))
        except BaseException:
            self._close()
            raise
        _RENEWALS.add(self)

    def release(self, remove: bool = False) -> None:
        """Stop renewing, remove our lease, drop the lock; with `remove`, the lock file too."""
        if self.fd is None:
            return
        _RENEWALS.remove(self)  # no renewal runs once this returns
        current = Lease.read(self.lease_path)
        if self.lease is not None and current is not None and current.token == self.lease.token:
            self.lease_path.unlink(missing_ok=True)
        if remove:  # still under the lock; a run that opened the file meanwhile sees it gone and retries
            self.lock_path.unlink(missing_ok=True)
        self._close()

    def _lock(self) -> bool:
        """flock the lock file: True once it is ours, False where this file system has no flock."""
        for _ in range(5):
            with writing("the lock file", self.lock_path):
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._in_use(Lease.read(self.lease_path)) from None
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    os.close(fd)
                    raise
                logger.info(f"{self.dir}: this file system refuses flock ({e.strerror}); the lease alone guards it")
                self.fd = fd
                return False
            try:  # the file we locked must still be the one at that name (see release(remove=True))
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return True
            os.close(fd)
        raise UsageError(f"{self.lock_path} keeps being replaced while this run tries to lock it")

    def _live_holder(self, held: Lease, os_lock: bool) -> Lease | None:
        """The lease's holder if it still lives, else None (the lease is stale)."""
        if held.host == socket.gethostname():
            return held if not os_lock and _pid_alive(held.pid) else None
        if time.time() - held.renewed > OLD_SECONDS:
            return None
        logger.warning(
            f"{self.dir} has a lease of {held.describe()}, and the lock may not reach that host: "
            f"watching the lease for up to {STALE_SECONDS:.0f} s to see whether its run is alive"
        )
        deadline = time.monotonic() + STALE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(min(1.0, RENEW_SECONDS / 4))
            now = Lease.read(self.lease_path)
            if now is None:
                return None  # its run ended and removed it
            if (now.token, now.count) != (held.token, held.count):
                return now  # renewed, or taken by yet another run: alive either way
        return None

    def _in_use(self, holder: Lease | None) -> UsageError:
        who = holder.describe() if holder is not None else f"the process that holds {self.lock_path}"
        return UsageError(
            f"{self.dir} is in use by another run ({who}); wait for it to end or stop it, "
            f"or choose another {setting('output_dir')}"
        )

    def renew(self) -> None:
        """Rewrite the lease with a new count and time, unless another run took it over."""
        assert self.lease is not None
        current = Lease.read(self.lease_path)
        if current is not None and current.token != self.lease.token:
            if not self._warned:
                logger.error(f"{self.dir}: another run took over its lease ({current.describe()})")
                self._warned = True
            return
        self.lease.count += 1
        self.lease.renewed = time.time()
        try:
            write_json_atomic(self.lease_path, asdict(self.lease))
        except (UsageError, OSError) as e:  # a full disk, say: the run itself reports it
            logger.warning(f"cannot renew the lease {self.lease_path}: {e}")

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None


class _Renewals:
    """The process's one thread that renews the leases of its runs, every RENEW_SECONDS each.

    It starts with the first lease and never ends, so that no thread of a run ends when the run
    does: on CPython before python/cpython#112275's fix, a thread that is ending while the
    process forks (the DataLoader workers of the next run in the process: a sweep, a notebook)
    can deadlock the child, and a joined thread may still be ending (it is joinable before its
    interpreter state is gone). It costs one idle daemon thread for the process's life."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._due: dict[RunLock, float] = {}  # each held lease's next renewal, time.monotonic()
        self._thread: threading.Thread | None = None

    def add(self, lock: RunLock) -> None:
        with self._guard:
            self._due[lock] = time.monotonic() + RENEW_SECONDS
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="accel_mnist-lease", daemon=True)
                self._thread.start()
        self._wake.set()  # its first renewal may be due sooner than the thread's current wait

    def remove(self, lock: RunLock) -> None:
        with self._guard:  # waits out a renewal in progress
            self._due.pop(lock, None)

    def _run(self) -> None:
        while True:
            with self._guard:
                now = time.monotonic()
                for lock, due in self._due.items():
                    if due <= now:
                        lock.renew()
                        self._due[lock] = now + RENEW_SECONDS
                wait = min(self._due.values(), default=now + 3600.0) - now
            self._wake.wait(max(0.0, wait))
            self._wake.clear()


_RENEWALS = _Renewals()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

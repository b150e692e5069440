"""One live run per output directory: the OS lock, and the lease that covers machines the lock
may not reach (a lease of another host is simulated by writing its file)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict

import pytest

from accel_mnist.errors import UsageError
from accel_mnist.run import lock as lock_module
from accel_mnist.run.lock import LEASE_FILE, LOCK_FILE, Lease, RunLock


def lease_of(host: str, pid: int, age: float = 0.0, count: int = 0) -> Lease:
    now = time.time() - age
    return Lease(host=host, pid=pid, started=now, renewed=now, count=count, token=f"{host}-{pid}")


def write_lease(directory, lease: Lease) -> None:
    (directory / LEASE_FILE).write_text(json.dumps(asdict(lease)))


def test_a_second_holder_is_refused_with_the_holder_named_and_nothing_written(tmp_path):
    first = RunLock(tmp_path / "run")
    first.acquire()
    lease = json.loads((tmp_path / "run" / LEASE_FILE).read_text())
    assert (lease["host"], lease["pid"]) == (socket.gethostname(), os.getpid())
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in (tmp_path / "run").iterdir()}
    # Another open file description conflicts with the first even within one process, as a second run would.
    with pytest.raises(UsageError, match=rf"is in use by another run \(pid {os.getpid()} on host "):
        RunLock(tmp_path / "run").acquire()
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in (tmp_path / "run").iterdir()}
    assert before == after
    first.release()
    assert not (tmp_path / "run" / LEASE_FILE).exists() and (tmp_path / "run" / LOCK_FILE).exists()
    second = RunLock(tmp_path / "run")
    second.acquire()  # free again
    second.release(remove=True)
    assert list((tmp_path / "run").iterdir()) == []


def test_a_lease_left_on_this_machine_is_settled_by_the_lock(tmp_path):
    """A run killed with SIGKILL leaves its lease; the lock is gone with it, so the next run takes over."""
    (tmp_path / "run").mkdir()
    write_lease(tmp_path / "run", lease_of(socket.gethostname(), os.getppid()))  # a live pid, without the lock
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    assert json.loads((tmp_path / "run" / LEASE_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_live_lease_of_another_machine_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(lock_module, "STALE_SECONDS", 5.0)
    (tmp_path / "run").mkdir()
    stop = threading.Event()

    def other_host_renews() -> None:  # a run on a host whose flock this file system does not share
        count = 0
        while not stop.wait(0.2):
            count += 1
            write_lease(tmp_path / "run", lease_of("node-b", 4242, count=count))

    write_lease(tmp_path / "run", lease_of("node-b", 4242))
    renewer = threading.Thread(target=other_host_renews)
    renewer.start()
    try:
        start = time.monotonic()
        with pytest.raises(UsageError, match=r"is in use by another run \(pid 4242 on host node-b, started "):
            RunLock(tmp_path / "run").acquire()
        assert time.monotonic() - start < 3  # known alive at its first renewal
    finally:
        stop.set()
        renewer.join()


def test_a_lease_of_another_machine_that_is_not_renewed_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(lock_module, "STALE_SECONDS", 1.0)
    (tmp_path / "run").mkdir()
    write_lease(tmp_path / "run", lease_of("node-b", 4242))  # its run died a moment ago
    start = time.monotonic()
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    assert 1.0 <= time.monotonic() - start < 3
    assert json.loads((tmp_path / "run" / LEASE_FILE).read_text())["host"] == socket.gethostname()
    lock.release()
    # Long dead by any clock: taken over without watching it.
    write_lease(tmp_path / "run", lease_of("node-b", 4242, age=lock_module.OLD_SECONDS + 60))
    start = time.monotonic()
    lock.acquire()
    assert time.monotonic() - start < 0.5
    lock.release()


def test_the_live_run_renews_its_lease(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "RENEW_SECONDS", 0.05)
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    try:
        deadline = time.monotonic() + 5
        while json.loads((tmp_path / "run" / LEASE_FILE).read_text())["count"] < 3:
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.05)
    finally:
        lock.release()


def test_runs_share_one_renewing_thread_that_outlives_them(tmp_path, monkeypatch):
    """No thread ends when a run does (a fork at that moment can deadlock, docs/strategies.md), and a
    released lease is not written again."""
    monkeypatch.setattr(lock_module, "RENEW_SECONDS", 0.05)
    seen = []
    for name in ("a", "b"):
        lock = RunLock(tmp_path / name)
        lock.acquire()
        seen.append({t for t in threading.enumerate() if t.name == "accel_mnist-lease"})
        deadline = time.monotonic() + 5
        while json.loads((tmp_path / name / LEASE_FILE).read_text())["count"] < 2:
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.02)
        lock.release()
    assert len(seen[0]) == 1 and seen[0] == seen[1] and next(iter(seen[0])).is_alive()
    time.sleep(0.2)  # four renewal periods: none may write the released leases again
    assert not (tmp_path / "a" / LEASE_FILE).exists() and not (tmp_path / "b" / LEASE_FILE).exists()

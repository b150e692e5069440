"""Waiting out the threads that DataLoader workers leave ending, before this process forks again.

A DataLoader with worker processes feeds each worker's index queue through a thread of its own
(multiprocessing's "QueueFeederThread"). When an iterator shuts its workers down it closes those
queues without joining their threads, which end on their own a moment later. A fork in that moment
(the next loader's workers) can deadlock the child on a CPython without python/cpython#112275's fix
(CI's 3.11.7 among them): the ending thread holds the interpreter's thread-list lock, and the child
inherits it locked. In CI a ZeRO-3 cell that trains, then resumes in the same process, hung so: its second
process still had a feeder thread after its first run returned (an iterator held in a reference
cycle, shut down only at some later collection, at any moment of the next run), and one of its
evaluations never reached the gather the other process waited in.

So whoever drops loaders with workers first collects what no longer holds them, then joins the
feeder threads started since it began (a bounded wait each): by the time the next fork comes, no
such thread is ending. It costs one garbage collection and the threads' last moments, and only
where `num_workers` > 0.
"""

from __future__ import annotations

import gc
import threading

FEEDER = "QueueFeederThread"  # multiprocessing.queues.Queue._start_thread's name for its thread
# A feeder thread ends as soon as it has written what it holds; one whose pipe's reader is gone (a
# worker killed) never may, and is left to end, or not, with the process.
JOIN_SECONDS = 5.0


class WorkerThreads:
    """The feeder threads that start from now on: `settle()` waits them out once their loaders are dropped."""

    def __init__(self) -> None:
        self.before = frozenset(threading.enumerate())

    def started(self) -> list[threading.Thread]:
        """Feeder threads alive now that were not alive when this began."""
        return [t for t in threading.enumerate() if t.name == FEEDER and t not in self.before]

    def settle(self, timeout: float = JOIN_SECONDS) -> None:
        """Collect loaders that only reference cycles still hold (their iterators shut the workers down as
        they go), then join each feeder thread started since this began, up to `timeout` seconds each."""
        gc.collect()
        for thread in self.started():
            thread.join(timeout)

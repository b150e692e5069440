"""How much GPU memory each cell of the GPU tier held (tests/gpu_suite.py): `nvidia-smi` sampled once a
second, each compute process's memory counted to the cell whose process tree holds it, and the card's
own total with the cells that ran at its peak. The scheduler declares what each cell may hold
(`Cell.gib`); this is what they held, so that a declaration too small shows in the table."""

from __future__ import annotations

import shutil
import subprocess
import threading

from tests.process_tree import parents, tree

QUERY_APPS = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
QUERY_CARD = ["--query-gpu=memory.used", "--format=csv,noheader,nounits"]


def _numbers(args: list[str]) -> list[list[int]]:
    """nvidia-smi's CSV rows as integers (none where it is missing or fails)."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells and all(c.isdigit() for c in cells):
            rows.append([int(c) for c in cells])
    return rows


class CardWatch:
    """Samples the card every `interval` seconds while the suite runs; `track(name, pid)` when a cell starts,
    `untrack(name)` when it ends; `peak_gib(name)` and `card_peak` after."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.available = shutil.which("nvidia-smi") is not None
        self.roots: dict[str, int] = {}
        self.peaks: dict[str, int] = {}  # MiB, the largest sum over a cell's processes in one sample
        self.card_peak: tuple[int, list[str]] = (0, [])  # MiB in use on the card, and the cells running then
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="card-watch", daemon=True)

    def __enter__(self) -> CardWatch:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def track(self, name: str, pid: int) -> None:
        """Count the processes under `pid` to the cell `name` from now on."""
        with self._lock:
            self.roots[name] = pid

    def untrack(self, name: str) -> None:
        """The cell `name` ended: its processes are no longer looked for."""
        with self._lock:
            self.roots.pop(name, None)

    def peak_gib(self, name: str) -> float | None:
        """The most the cell's processes held at once, in GiB (None: never seen, or no nvidia-smi)."""
        mib = self.peaks.get(name)
        return round(mib / 1024, 1) if mib is not None else None

    def sample(self) -> None:
        """One reading of the card and its processes."""
        used = {pid: mib for pid, mib in _numbers(QUERY_APPS)}
        card = sum(row[0] for row in _numbers(QUERY_CARD)[:1])
        with self._lock:
            roots = dict(self.roots)
        links = parents()
        for name, root in roots.items():
            held = sum(used.get(pid, 0) for pid in tree(root, links))
            if held:
                self.peaks[name] = max(self.peaks.get(name, 0), held)
        if card > self.card_peak[0]:
            self.card_peak = (card, sorted(roots))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

"""The processes of a launch: `accelerate launch` runs torchrun's agent itself, and the agent
starts each worker in a session of its own, so a process group does not reach them."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def parents() -> dict[int, int]:
    """Every process's parent, read from /proc once."""
    found = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(p)] = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    return found


def tree(pid: int, known: dict[int, int] | None = None) -> list[int]:
    """`pid` and its descendants, parents first; `known`: parents() read already (several trees at once)."""
    links = known if known is not None else parents()
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, pp in links.items() if pp == parent]
        found += children
        frontier += children
    return found


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to `pid` and every descendant (SIGSTOP/SIGCONT a whole launch)."""
    for p in tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; only its parent's wait is missing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""Inductor's compile threads for a run: one, unless the caller set TORCHINDUCTOR_COMPILE_THREADS.

By default inductor compiles Triton kernels in a pool of worker processes, one per core up to 32, started
by the first compilation and shut down at exit. A model of this project's size compiles a few dozen kernels:
on one H100 (16 cores) the compiled recipe's whole command took 33.4 s with the pool and 34.9 s with one
thread on a cold compile cache, and 22.5-24.1 s against 14.3-17.3 s on a warm one, where the pool only costs
its start and its shutdown (benchmarks/results/h100-2026-12-06-command). A larger model of your own, on a
cold cache, may compile faster in parallel: set the variable (TORCHINDUCTOR_COMPILE_THREADS=16, say).

The variable is read once, when inductor's config is imported; where that happened before the run (a
caller's own torch.compile), the run keeps what inductor decided then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

VARIABLE = "TORCHINDUCTOR_COMPILE_THREADS"


def default_compile_threads(env: MutableMapping[str, str] | None = None) -> None:
    """Ask inductor for one compile thread where the caller set none and inductor has not read it yet."""
    env = os.environ if env is None else env
    if VARIABLE not in env and "torch._inductor.config" not in sys.modules:
        env[VARIABLE] = "1"


def compile_threads(env: MutableMapping[str, str] | None = None) -> str | None:
    """The variable as this process has it (results.json's `compile_threads` where dynamo is on)."""
    return (os.environ if env is None else env).get(VARIABLE)

"""Inductor's cache keys hashed in the background while a compiled run sets up.

Before a compiled model's first call can load its graph from inductor's caches, torch hashes its own
sources (`torch_key`) and Triton's sources and library, libtriton's ~500 MB included (`triton_key`): once per
process, on the main thread, inside the run's first compiled step. torch (2.13 and later) gives both keys a
`prefetch()` that starts that hashing in a thread of its own. Where the launch asks for inductor, the CLI
calls it first thing, so that the hashing overlaps the import of accelerate and the run's setup (most of it
reading files and sha256, which release the GIL), and `accel_mnist.train()` calls it again for callers from
Python (nothing happens where the keys are on their way). A compiled command's seconds on CPU:
docs/measurements.md#distributedcompile_keyspy.

What it costs: `torch._inductor.codecache` is imported here rather than at the first compiled step (the same
import, earlier), and one of torch's worker threads hashes for about half a second of one core. The keys are
the ones torch computes anyway, by its own code, so nothing about caching changes. A torch without
`prefetch` (before 2.13) or without inductor: nothing happens. The import comes before the threads start, so
they import nothing the main thread may be importing at the same time.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .compile_threads import default_compile_threads

KEYS = ("torch_key", "triton_key")
# Where `accelerate launch` puts the config's dynamo_backend (or its --dynamo_backend) for the processes it
# starts; Accelerate's TorchDynamoPlugin reads it there.
LAUNCH_VARIABLE = "ACCELERATE_DYNAMO_BACKEND"


def prefetch_for_launch(env: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """Where the launch's environment asks for inductor (the variable Accelerate reads the run's dynamo backend
    from), set the run's compile threads (inductor reads them on import: compile_threads.py) and start hashing
    the keys; return the names of the keys started. Before accelerate is imported, in the CLI."""
    env = os.environ if env is None else env
    if env.get(LAUNCH_VARIABLE, "no").lower() != "inductor":
        return ()
    default_compile_threads(env)
    return prefetch_compile_keys("inductor")


def prefetch_compile_keys(dynamo_backend: str) -> tuple[str, ...]:
    """Start hashing inductor's cache keys in the background where `dynamo_backend` (lower case) is inductor;
    return the names of the keys started (none elsewhere, or on a torch without `prefetch`). A key already
    computed or on its way in this process is not computed again (torch's cache)."""
    if dynamo_backend != "inductor":
        return ()
    try:
        from torch._inductor import codecache
    except ImportError:  # a torch built without inductor: the compile itself will say so
        return ()
    started = []
    for name in KEYS:
        prefetch = getattr(getattr(codecache, name, None), "prefetch", None)
        if callable(prefetch):
            prefetch()
            started.append(name)
    return tuple(started)

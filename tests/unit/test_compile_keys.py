"""distributed/compile_keys.py: where the launch asks for inductor, the cache keys are hashed off the main
thread, after the compile threads are set, and they are torch's own keys; elsewhere nothing is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from accel_mnist.distributed.compile_keys import prefetch_compile_keys, prefetch_for_launch
from tests.helpers import REPO

# In a fresh process (the keys are cached per process): what prefetch_for_launch did, then the keys.
PROBE = """
import json, sys, threading
from accel_mnist.distributed.compile_keys import prefetch_for_launch
before = threading.active_count()
started = prefetch_for_launch()
facts = {"started": list(started), "threads_added": threading.active_count() - before,
         "codecache": "torch._inductor.codecache" in sys.modules}
if started:
    import torch._inductor.config as config
    from torch._inductor import codecache
    facts.update(compile_threads=config.compile_threads, torch_key=codecache.torch_key().hex(),
                 triton_key=codecache.triton_key())
print(json.dumps(facts))
"""
# The same keys computed the usual way, with no prefetch.
PLAIN = """
import json
from torch._inductor import codecache
print(json.dumps({"torch_key": codecache.torch_key().hex(), "triton_key": codecache.triton_key()}))
"""


def _run(code: str, backend: str | None) -> dict[str, object]:
    unset = ("ACCELERATE_DYNAMO_BACKEND", "TORCHINDUCTOR_COMPILE_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if backend is not None:
        env["ACCELERATE_DYNAMO_BACKEND"] = backend
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_inductor_launch_hashes_torchs_own_keys_in_a_thread_after_the_compile_threads() -> None:
    facts = _run(PROBE, "INDUCTOR")
    assert facts["started"] == ["torch_key", "triton_key"]
    assert facts["threads_added"] >= 1  # the hashing runs beside the main thread
    # compile_threads.py's one thread, set before this import of inductor's config read it
    assert facts["compile_threads"] == 1
    plain = _run(PLAIN, None)
    assert (facts["torch_key"], facts["triton_key"]) == (plain["torch_key"], plain["triton_key"])


def test_no_compilation_asked_nothing_imported_no_thread() -> None:
    for backend in (None, "NO", "AOT_EAGER"):
        assert _run(PROBE, backend) == {"started": [], "threads_added": 0, "codecache": False}, backend


def test_other_backends_and_the_caller_s_own_threads_setting() -> None:
    assert prefetch_compile_keys("no") == ()
    assert prefetch_compile_keys("aot_eager") == ()
    env = {"ACCELERATE_DYNAMO_BACKEND": "eager"}
    assert prefetch_for_launch(env) == ()
    assert env == {"ACCELERATE_DYNAMO_BACKEND": "eager"}  # compile threads left alone where nothing compiles

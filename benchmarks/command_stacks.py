"""Where a whole command's seconds go, imports and process start included, sampled rather than traced.

    python -m benchmarks.command_stacks --out stacks.txt -- accel_mnist train --config recipes/fast99_graph.yaml

runs `python -m MODULE ARGS...` in this process while a thread reads the main thread's stack every
`--interval` seconds, then prints the seconds spent inside each function (inclusive), the project's
and the libraries' alike, and writes the samples as collapsed stacks (`--out`: one `frame;frame;... seconds`
line per stack, the format flame-graph viewers such as speedscope open).

Why sampling: cProfile's hook sits beside dynamo's frame evaluation and leaves the cumulative times of a
compiled run's functions unusable (seen on one H100), and it slows every Python call, where a command of
ten seconds is mostly imports and library start-up. The sampler costs one stack walk per interval. A C
call that holds the GIL (a CUDA library's load, say) blocks the sampler too: the seconds between two
samples go to the stack the second one sees, which is the same call where the call has not returned yet.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import FrameType


def frame_name(frame: FrameType) -> str:
    """`module-ish path:function` for one frame: the file's path from its package down (site-packages cut)."""
    path = frame.f_code.co_filename
    for marker in ("site-packages/", "dist-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = Path(path).name if "accel_mnist" not in path else path[path.index("accel_mnist") :]
    return f"{path}:{frame.f_code.co_name}"


def stack_of(frame: FrameType | None) -> tuple[str, ...]:
    """The frames from the outermost down to `frame`."""
    names = []
    while frame is not None:
        names.append(frame_name(frame))
        frame = frame.f_back
    return tuple(reversed(names))


class Sampler:
    """Samples one thread's stack every `interval` seconds; each sample holds the seconds since the last."""

    def __init__(self, interval: float) -> None:
        self.interval, self.target = interval, threading.get_ident()
        self.samples: Counter[tuple[str, ...]] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.target)
            now = time.perf_counter()
            self.samples[stack_of(frame)[2:]] += now - last  # this module's own two frames left out
            last = now

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def inclusive(samples: Counter[tuple[str, ...]]) -> Counter[str]:
    """Seconds with each function anywhere on the stack (counted once per sample, recursion or not)."""
    total: Counter[str] = Counter()
    for stack, seconds in samples.items():
        for name in set(stack):
            total[name] += seconds
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """Run the module under the sampler, print the table, write the collapsed stacks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between samples")
    parser.add_argument("--top", type=int, default=60, help="functions in the printed table")
    parser.add_argument("--out", type=Path, help="collapsed stacks to write")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no module to run: add -- MODULE ARGS...")
    start, rc = time.perf_counter(), 0
    sys.argv = list(command)
    with Sampler(args.interval) as sampler:
        try:
            runpy.run_module(command[0], run_name="__main__", alter_sys=True)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    wall = time.perf_counter() - start
    totals = inclusive(sampler.samples)
    print(f"\n{wall:.2f} s in the module (rc {rc}), {sum(sampler.samples.values()):.2f} s sampled", file=sys.stderr)
    for name, seconds in totals.most_common(args.top):
        print(f"{seconds:8.2f} s  {name}", file=sys.stderr)
    if args.out:
        lines = (f"{';'.join(stack) or '<idle>'} {seconds:.4f}" for stack, seconds in sampler.samples.most_common())
        args.out.write_text("\n".join(lines) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

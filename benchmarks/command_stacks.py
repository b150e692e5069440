"""Where a whole command's seconds go, imports and process start included, sampled rather than traced.

    python -m benchmarks.command_stacks --out stacks.txt -- accel_mnist train --config recipes/fast99_graph.yaml
    python -m benchmarks.command_stacks --read stacks.txt --phase training/prewarm.py:prewarm --phase ...

runs `python -m MODULE ARGS...` in this process while a thread reads the main thread's stack every
`--interval` seconds, then prints the seconds spent inside each function (inclusive), the project's
and the libraries' alike, and writes the samples as collapsed stacks (`--out`: one `frame;frame;... seconds`
line per stack, the format flame-graph viewers such as speedscope open). `--read` prints such a file's seconds per
phase: the first `--phase` function on each sample's stack, split into imports, dynamo's tracing, inductor and
the rest.

Why sampling: cProfile's hook sits beside dynamo's frame evaluation and leaves the cumulative times of a
compiled run's functions unusable (seen on one H100), and it slows every Python call, where a command of
ten seconds is mostly imports and library start-up. The sampler costs one stack walk per interval. A C
call that holds the GIL (a CUDA library's load, say) blocks the sampler too: the seconds between two
samples go to the stack the second one sees, which is the same call where the call has not returned yet.
"""

from __future__ import annotations

import argparse
import gzip
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


def read_stacks(path: Path) -> Counter[tuple[str, ...]]:
    """Collapsed stacks as `--out` wrote them (gzipped where the name ends in .gz, as results folders keep them)."""
    samples: Counter[tuple[str, ...]] = Counter()
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, seconds = line.rsplit(" ", 1)
        samples[tuple(stack.split(";")) if stack != "<idle>" else ()] += float(seconds)
    return samples


# What a phase's seconds were spent on, the first that matches the stack: an import, dynamo's tracing, inductor.
KINDS = (("import", "_find_and_load"), ("dynamo", "torch/_dynamo/convert_frame.py"), ("inductor", "torch/_inductor/"))


def phases(samples: Counter[tuple[str, ...]], names: Sequence[str]) -> dict[str, Counter[str]]:
    """Seconds per phase: each sample goes to the first of `names` (`path:function` endings) on its stack, else to
    "other"; within a phase, split by KINDS (else "rest")."""
    table: dict[str, Counter[str]] = {name: Counter() for name in (*names, "other")}
    for stack, seconds in samples.items():
        phase = next((n for n in names if any(frame.endswith(n) for frame in stack)), "other")
        kind = next((k for k, mark in KINDS if any(mark in frame for frame in stack)), "rest")
        table[phase][kind] += seconds
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Run the module under the sampler, print the table, write the collapsed stacks; or `--read` such stacks and
    print seconds per `--phase`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between samples")
    parser.add_argument("--top", type=int, default=60, help="functions in the printed table")
    parser.add_argument("--out", type=Path, help="collapsed stacks to write")
    parser.add_argument("--read", type=Path, help="collapsed stacks written before: print their phases, run nothing")
    parser.add_argument("--phase", action="append", default=[], help="a phase's function (path:function ending); "
                        "repeat, the first on a sample's stack wins")  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE ARGS...")
    args = parser.parse_args(argv)
    if args.read:
        for name, kinds in phases(read_stacks(args.read), args.phase).items():
            parts = ", ".join(f"{kind} {seconds:.2f}" for kind, seconds in kinds.most_common())
            print(f"{sum(kinds.values()):8.2f} s  {name}: {parts}")
        return 0
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

r"""Train one of benchmarks/families.py's models with accel_mnist's loop, flags as `accel-mnist train` takes them.

    accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 1 \
        -m benchmarks.family_worker --family gru [--cap-gib 2] --batch-size 1024 --max-steps 4 ...

`--family NAME` picks the model (`FAMILIES[NAME]()`, passed to `train(config, model=...)`);
`--cap-gib G` caps this process's CUDA allocator first (benchmarks/capped.py); every other flag
is parsed by accel_mnist's own CLI parser into the TrainConfig (`--model` is not used). A bad
flag or value, or running out of memory, ends in one `error: ...` line and the CLI's exit code.
"""

from __future__ import annotations

import sys

from benchmarks.families import FAMILIES


def main(argv: list[str] | None = None) -> int:
    from accel_mnist.cli import _Parser  # the CLI's parser class: a bad flag ends in one line and exit code 2

    own = _Parser(prog="benchmarks.family_worker", allow_abbrev=False, add_help=False)
    own.add_argument("--family", required=True, choices=sorted(FAMILIES))
    own.add_argument("--cap-gib", type=float, default=None, help="cap this process's CUDA allocator at G GiB")
    args, rest = own.parse_known_args(argv)
    if args.cap_gib is not None:
        from benchmarks.capped import cap

        cap(args.cap_gib)
    from accel_mnist import train
    from accel_mnist.cli import build_parser, config_from_args
    from accel_mnist.errors import UsageError

    parsed = build_parser().parse_args(["train", *rest])  # a bad flag: one line and exit code 2, as the CLI's
    try:
        config = config_from_args(parsed)
        train(config, model=FAMILIES[args.family]())
    except UsageError as e:  # the CLI's ending: one line, the error's exit code (3: out of memory)
        if parsed.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

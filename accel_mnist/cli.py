"""Command line: `accel-mnist train [flags]`, also as `python -m accel_mnist`, under
`accelerate launch -m accel_mnist`, `torchrun -m accel_mnist` and `deepspeed --module accel_mnist`.

Bad input ends with one `error: ...` line on stderr and exit code 2 (a traceback only with --debug),
a file the storage would not take with exit code 74; a run stopped by SIGTERM/SIGUSR1 after saving
its checkpoint ends with exit code 75. In a launch of several processes, a message that every
process has alike is printed by one process per machine (its local main process); the others
exit with the same code in silence.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from .caller import FLAG_SPELLINGS, command_line
from .config import TrainConfig, coerce, load_config_file, parse_bool
from .errors import UsageError, on_every_rank
from .launch.launcher_watch import exit_orphaned, local_main_process, orphaned
from .training.preemption import EXIT_PREEMPTED, Preempted

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process SIGPIPE ended (128 + 13)


# How long a process that leaves a shared line to its local main process waits before it exits:
# under torchrun the first worker to exit makes the agent SIGTERM the others, which could end
# the local main process before it has printed.
QUIET_EXIT_SECONDS = 5.0


def _finish(line: str, code: int, every_rank: bool = True) -> int:
    """Print `line` on stderr and return `code`; where every process has the line, only the local
    main process prints it, and the others return the same code after it has had time to."""
    if not every_rank or local_main_process():
        print(line, file=sys.stderr)
        return code
    if threading.current_thread() is threading.main_thread():
        # The launcher ending the group, once the local main process has exited, ends this one alike.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(code))
    time.sleep(QUIET_EXIT_SECONDS)
    return code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse prints the whole usage first; one line that says what is wrong is kinder.
        raise SystemExit(_finish(f"error: {message} (see '{self.prog} --help')", EXIT_USAGE))


# Other spellings of a field's flag (caller.FLAG_SPELLINGS: --deepspeed_config): a command line
# written for DeepSpeed's scripts should run unchanged.
_ALIASES = {name: (flag,) for name, flag in FLAG_SPELLINGS.items()}


class _BoolFlag(argparse.Action):
    """A boolean as Accelerate's flags take one: `--plots`, `--plots true`, `--plots false`, and `--no-plots`.

    argparse's BooleanOptionalAction takes no value, so `--cycle-momentum true` stopped with
    "unrecognized arguments: true"; the value is read as a config file's would be (config.parse_bool).
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        negated = [f"--no-{o[2:]}" for o in option_strings if o.startswith("--")]
        kwargs.pop("nargs", None)
        super().__init__([*option_strings, *negated], dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        flag = option_string or ""
        negated = flag.startswith("--no-")
        if values is None:
            setattr(namespace, self.dest, not negated)
            return
        if negated:
            parser.error(f"{flag} takes no value; use --{flag[5:]} {values}")
        parsed = parse_bool(str(values))
        if parsed is None:
            parser.error(f"{option_string}: expected true or false, got {values!r}")
        setattr(namespace, self.dest, parsed)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows a boolean's flags as `--plots [true|false], --no-plots`: the value goes to the first only.

    argparse writes one metavar after every spelling, and so promised `--no-plots [true|false]`,
    which _BoolFlag refuses (a double negative reads either way).
    """

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not isinstance(action, _BoolFlag):
            return super()._format_action_invocation(action)
        return ", ".join(o if o.startswith("--no-") else f"{o} [{action.metavar}]" for o in action.option_strings)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, so that the CLI can never drift from the config."""
    hints = get_type_hints(TrainConfig)
    group = parser.add_argument_group("training config (flags override --config)")
    for f in fields(TrainConfig):
        flags = ["--" + f.name.replace("_", "-"), *_ALIASES.get(f.name, ())]
        default = None if f.default is MISSING else f.default
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        if hints[f.name] is bool:
            group.add_argument(*flags, dest=f.name, action=_BoolFlag, default=argparse.SUPPRESS,
                               help=help_text)  # fmt: skip
        else:
            group.add_argument(*flags, dest=f.name, default=argparse.SUPPRESS, metavar=f.name.upper(),
                               help=help_text)  # fmt: skip


def _add_launcher_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    """--local_rank, which DeepSpeed's launcher passes to every process: it puts it before the
    subcommand, torch's older launcher after the script's other arguments."""
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=default,
                        help="set by DeepSpeed's launcher; must equal $LOCAL_RANK")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The `accel-mnist` parser: `train` plus the subcommands other modules register."""
    parser = _Parser(prog="accel-mnist", description="Train MNIST-class models with Accelerate and DeepSpeed.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    _add_launcher_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train and evaluate a model", formatter_class=_HelpFormatter)
    train.add_argument("--config", help="YAML or JSON file of training-config keys, or a shipped recipe by the "
                       "name accel-mnist configs lists (e.g. fast99; a file of that name wins)")  # fmt: skip
    train.add_argument("--deepspeed", action="store_true",
                       help="DeepSpeed's switch: train under DeepSpeed (needs --deepspeed_config)")  # fmt: skip
    _add_launcher_flags(train, default=argparse.SUPPRESS)
    _add_config_flags(train)
    train.set_defaults(handler=_train)
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(f".{module}", __package__).register(sub)
    for command in sub.choices.values():  # --debug is accepted after the subcommand too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config file's values, then the flags given on the command line on top."""
    values: dict[str, Any] = load_config_file(args.config) if args.config else {}
    source = args.config or "config"
    hints = get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name in vars(args):
            values[f.name] = coerce("--" + f.name.replace("_", "-"), getattr(args, f.name), hints[f.name])
    return TrainConfig.from_dict(values, source=source)


def _train(args: argparse.Namespace) -> int:
    from .distributed.compile_keys import prefetch_for_launch
    from .launch.launchers import check_local_rank

    prefetch_for_launch()  # a compiled run's cache keys hashed while accelerate is imported
    from .training.loop import train  # torch and accelerate: not for `--help` or the other commands

    settle_collector(args.own_process)
    check_local_rank(args.local_rank)
    try:
        config = config_from_args(args)
        if args.deepspeed and config.deepspeed_config is None:
            raise UsageError("--deepspeed needs --deepspeed_config ds_config.json (ZeRO stage, precision and offload)")
    except UsageError as e:  # every process reads the same command line and files
        raise on_every_rank(e) from None
    # Libraries stay at warnings (Accelerate logs every file it saves at info) unless debugging.
    level = config.log_level.upper()
    logging.basicConfig(
        format="%(levelname)s %(name)s: %(message)s",
        level=min(logging.WARNING, getattr(logging, level)) if level == "DEBUG" else logging.WARNING,
    )
    logging.getLogger("accel_mnist").setLevel(level)
    train(config, plots_in_background=True)
    return 0


def settle_collector(own_process: bool) -> None:
    """For a command that owns its process, once its imports are done: freeze what they left
    and turn the collector back on (main turned it off). torch and accelerate leave ~320k
    long-lived objects that each full collection would walk again: 0.12-0.19 s each on a
    2-core box, six in a 20-step fast99 command (three during the imports, one in Accelerate's
    `free_memory`). Frozen, later collections walk only the run's own objects."""
    if own_process and not gc.isenabled():
        gc.freeze()
        gc.enable()


# Modules that add their own subcommands through `register(subparsers)`.
SUBCOMMAND_MODULES = ("export.predict", "report", "shipped", "report.estimate_command")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `accel-mnist` console script; returns the exit code."""
    # argv None: the console script and `python -m`, whose process this is (tests pass argv).
    # No collections during the imports (torch is imported by the parser's modules already);
    # settle_collector turns it back on after them.
    own_process = argv is None
    if own_process:
        gc.disable()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.own_process = own_process
    if args.handler is not _train:  # the other commands import little more
        settle_collector(own_process)
    try:
        with command_line():  # its messages name flags, not TrainConfig fields (caller.py)
            return args.handler(args)
    except UsageError as e:
        if args.debug:
            raise
        return _finish(f"error: {e}", e.exit_code, e.every_rank)
    except Preempted as e:  # raised by every rank together, after they agreed to stop
        return _finish(f"stopped: {e}", EXIT_PREEMPTED)
    except KeyboardInterrupt:
        return _finish("error: interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`accel-mnist predict ... | head`): nothing is wrong with the run.
        # Point stdout at devnull so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception:
        if orphaned():  # a peer's collective failed because the launcher died: say that instead
            exit_orphaned()
        raise

"""How a message names a training setting: as the command line's flag (`--overwrite`, `--resume-from auto`)
inside `accel-mnist` and `python -m accel_mnist`, else as the TrainConfig field a Python caller of train()
sets (`overwrite=True`, `resume_from="auto"`): advice in flags is no use to a script or a notebook.

cli.main runs its command inside `command_line()`; every other caller gets the fields. A context
variable rather than a global: a train() called from Python in the same process is a Python caller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_COMMAND_LINE: ContextVar[bool] = ContextVar("accel_mnist_command_line", default=False)
# Flags spelt otherwise than `--` + the field with dashes: DeepSpeed's own spelling, which DeepSpeed's
# scripts and `deepspeed.add_config_arguments` use and DeepSpeed users know. cli.py takes it beside the
# dashed flag; messages name it so.
FLAG_SPELLINGS = {"deepspeed_config": "--deepspeed_config"}
_UNSET = object()


@contextmanager
def command_line() -> Iterator[None]:
    """Within it, messages name flags: cli.main runs each command in it."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def setting(name: str, value: object = _UNSET, *, again: bool = False) -> str:
    """TrainConfig field `name`, set to `value` where given, as this caller gives it: `--resume-from auto`,
    `--overwrite`, `--cycle-momentum false`, or `resume_from="auto"`, `overwrite=True`, `cycle_momentum=False`;
    without a value, the flag or the field alone. `again`: as advice to run once more with it ("the same
    command with --resume-from auto", "train() with resume_from="auto")."""
    if _COMMAND_LINE.get():
        flag = FLAG_SPELLINGS.get(name, "--" + name.replace("_", "-"))
        if value is _UNSET or value is True:
            text = flag
        else:
            text = f"{flag} {str(value).lower() if value is False else value}"
        return f"the same command with {text}" if again else text
    if value is _UNSET:
        text = name
    elif isinstance(value, (str, os.PathLike)):
        text = f"{name}={json.dumps(os.fspath(value))}"
    else:
        text = f"{name}={value!r}"
    return f"train() with {text}" if again else text

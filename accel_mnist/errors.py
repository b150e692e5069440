"""Errors that mean "the user asked for something that cannot work".

The CLI turns every `UsageError` into one `error: ...` line on stderr and exit code 2;
anything else is a bug and keeps its traceback.
"""

import re


class UsageError(Exception):
    """Bad input from the user: a flag, a config value, a data file, a path."""


class ConfigError(UsageError, ValueError):
    """A config key or value is unknown or out of range."""


class NonFiniteLossError(UsageError):
    """Training diverged: the loss stayed NaN/inf for --max-nonfinite steps."""


class DataError(UsageError):
    """A dataset file is missing, truncated or not what its name says."""


def one_line(message: object) -> str:
    """`message` (text or an exception) as one line: library errors often span several,
    and the CLI prints each error as a single `error: ...` line.

    torch wraps its weights-only unpickler's reason in paragraphs of advice; only the reason is kept.
    """
    raw = str(message)
    found = re.search(r"WeightsUnpickler error:(.*?)(Check the documentation|$)", raw, re.DOTALL)
    if found and found.group(1).strip():
        raw = found.group(1)
    text = " ".join(raw.split())
    if not text and isinstance(message, BaseException):
        return type(message).__name__
    return text

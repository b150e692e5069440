"""Errors that mean "the user asked for something that cannot work", or "the storage refused".

The CLI turns every `UsageError` into one `error: ...` line on stderr and its `exit_code`
(2, 74 for a `StorageError`, 3 for `OutOfMemory`); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

# sysexits.h's EX_IOERR: a file could not be written. Not EX_TEMPFAIL (75, preemption): a
# requeue script that retries at once would only fill the same disk again.
EXIT_STORAGE = 74
# The accelerator ran out of memory: not bad input as such, and not worth a retry at the same settings.
EXIT_OUT_OF_MEMORY = 3


class UsageError(Exception):
    """Bad input from the user: a flag, a config value, a data file, a path."""

    exit_code = 2
    # Set where every process of a launch raises this same error (an agreed check, a setting
    # read alike by all): then one process per machine prints it, not each of them.
    every_rank = False


class ConfigError(UsageError, ValueError):
    """A config key or value is unknown or out of range."""


class NonFiniteLossError(UsageError):
    """Training diverged: the loss stayed NaN/inf for --max-nonfinite steps."""


class DataError(UsageError):
    """A dataset file is missing, truncated or not what its name says."""


class StorageError(UsageError):
    """A file could not be written: the disk or quota is full, the file system is read-only,
    failing or refuses us. Reported like bad input (one line), with an exit code of its own."""

    exit_code = EXIT_STORAGE


class OutOfMemory(UsageError):
    """The accelerator's memory ran out: one line with what was needed, what there was and what would fit."""

    exit_code = EXIT_OUT_OF_MEMORY


def error_for(message: str, exit_code: int) -> UsageError:
    """The error another process raised, rebuilt from its message and exit code (consensus.agree)."""
    return StorageError(message) if exit_code == EXIT_STORAGE else UsageError(message)


def on_every_rank(error: UsageError) -> UsageError:
    """`error`, marked as raised alike by every process of the launch (see `UsageError.every_rank`)."""
    error.every_rank = True
    return error


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

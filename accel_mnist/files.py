"""File I/O that every part of accel_mnist shares: bounded JSON reading and atomic writes.

Files read here may come from someone else (a checkpoint, an export, a config), so every read
is bounded; files written here appear whole or not at all, so a crash never leaves half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import UsageError, one_line

MAX_JSON_BYTES = 1 << 20  # configs, states and results are a few kB; refuse to parse anything huge


def read_json_object(path: Path, name: str | None = None, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in `path` (an existing file); a one-line UsageError, prefixed with `name`
    (default: the path), if it is too large, not valid JSON or not an object."""
    name = name or str(path)
    try:
        if path.stat().st_size > max_bytes:
            raise UsageError(f"{name}: larger than {max_bytes} bytes")
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(f"{name}: not valid JSON: {one_line(e)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{name}: expected a JSON object, got {type(data).__name__}")
    return data


def read_json_if_valid(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any] | None:
    """`read_json_object(path)`, or None where the file is absent or unusable: for files an
    earlier run of ours may or may not have finished writing."""
    try:
        return read_json_object(path, max_bytes=max_bytes) if path.is_file() else None
    except UsageError:
        return None


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` so that readers see the old file or the new one, never half of one.

    The temporary name carries the pid, so that two writers never share one temporary file.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def json_bytes(data: Any) -> bytes:
    """The one JSON layout of every file accel_mnist writes: indented, sorted keys, a final newline."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as JSON, written atomically (see `write_atomic`)."""
    write_atomic(path, json_bytes(data))


def fsync_file(path: Path) -> None:
    """Flush `path` to stable storage before a rename publishes it."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())

"""File I/O that every part of accel_mnist shares: bounded JSON reading, atomic writes, and
what a failed write means.

Files read here may come from someone else (a checkpoint, an export, a config), so every read
is bounded; files written here appear whole or not at all, so a crash never leaves half of one.
A write that the storage refuses (full, quota, read-only, failing) becomes one StorageError
that says what was being written, where, and how much space is left (`writing`).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from .errors import StorageError, UsageError, one_line

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


# What the storage, rather than the caller, refused. EIO and ESTALE are a failing disk or a
# network file system that lost the file; EACCES/EPERM a directory this user may not write.
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.ESTALE, errno.EACCES, errno.EPERM}
)
# Below this, a write that failed without an errno is taken for a full disk.
_NEARLY_FULL_BYTES = 1 << 20


def free_bytes(path: Path) -> int | None:
    """Free space on the file system that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.absolute().parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def storage_errno(error: BaseException, path: Path) -> int | None:
    """The errno for which the storage refused a write under `path`, or None where `error` is
    something else. Libraries hide it: safetensors keeps it in its message ("os error 28"),
    and torch.save raises a RuntimeError without one ("unexpected pos"), judged here from the
    file system itself (read-only, or out of space)."""
    if isinstance(error, OSError):
        return error.errno if error.errno in STORAGE_ERRNOS else None
    found = re.search(r"os error (\d+)", str(error))
    if found:
        code = int(found.group(1))
        return code if code in STORAGE_ERRNOS else None
    if not isinstance(error, RuntimeError):
        return None
    try:
        if os.statvfs(path if path.exists() else path.parent).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        pass
    free = free_bytes(path)
    return errno.ENOSPC if free is not None and free < _NEARLY_FULL_BYTES else None


def size_text(n: int | None) -> str:
    """`n` bytes for a person: 0 B, 12 kB, 3.4 MB, 1.2 GB."""
    if n is None:
        return "an unknown amount"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


@contextmanager
def writing(what: str, path: Path) -> Iterator[None]:
    """Turn the storage's refusal of a write under `path` into one StorageError that names
    `what` was being written, where, and the space left; other errors pass unchanged."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        code = storage_errno(e, path)
        if code is None:
            raise
        raise StorageError(
            f"cannot write {what} ({path}): {os.strerror(code)}, {size_text(free_bytes(path))} free on that file system"
        ) from e


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (bytes, or chunks of them) so that readers see the old file or the new
    one, never half of one.

    The temporary name carries the pid, so that two writers never share one temporary file.
    A write the storage refuses raises StorageError (see `writing`); the old file stays.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path.name, path):
            with open(tmp, "wb") as f:
                for chunk in [data] if isinstance(data, bytes) else data:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        with suppress(OSError):  # absent once renamed; on a read-only file system never made
            tmp.unlink()


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


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure as a PNG, atomically: it is drawn in memory first, so that a reader
    never sees half a PNG and the temporary file exists for one write only (a run directory may be
    copied while its plots are drawn in the background)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=100, format="png")
    write_atomic(path, buffer.getvalue())
    return path

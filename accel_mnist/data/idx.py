"""IDX files (MNIST's format), read with bounded memory: they may come from someone else."""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError, one_line

# IDX type code -> big-endian numpy dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"
# The largest array an IDX file may declare: MNIST's training images are 47 MB. What a header
# declares is allocated only as the data arrives, never on the header's word alone.
MAX_IDX_BYTES = 128 * 2**20
MAX_TRAILING = 2**16  # bytes read past the declared data to refuse it (a bomb may hold GBs)
_CHUNK = 2**20


def read_idx(
    path: str | os.PathLike, max_bytes: int = MAX_IDX_BYTES, shape: tuple[int | None, ...] | None = None
) -> np.ndarray:
    """Read one IDX file (gzipped or raw) into a writable native-endian array; DataError if invalid.

    Streamed, so that a small file cannot make it allocate much: the header is read first, and
    its shape must match `shape` (None: any size) and declare at most `max_bytes`; then exactly
    that many bytes are read, and at most `MAX_TRAILING` more to refuse data past the end.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({one_line(exc.strerror or exc)})") from None
    with f:
        gz = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f) if gz else contextlib.nullcontext(f) as stream:
                return _read_idx_stream(stream, path, max_bytes, shape)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            if gz:
                raise DataError(f"{path}: corrupt gzip stream ({one_line(exc)})") from None
            raise DataError(f"{path}: cannot read file ({one_line(exc)})") from None


def _read_idx_stream(stream: Any, path: Path, max_bytes: int, shape: tuple[int | None, ...] | None) -> np.ndarray:
    head = stream.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(head)} bytes)")
    (magic,) = struct.unpack(">I", head)
    code, ndim = head[2], head[3]
    if head[0] != 0 or head[1] != 0 or not 1 <= ndim <= 4:
        raise DataError(f"{path}: bad magic number 0x{magic:08x} (expected an IDX file, 0x00000801 or 0x00000803)")
    if code not in _IDX_DTYPES:
        supported = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise DataError(f"{path}: unsupported IDX data type code 0x{code:02x} (supported: {supported})")
    raw_dims = stream.read(4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise DataError(f"{path}: truncated header: expected {4 + 4 * ndim} bytes, found {4 + len(raw_dims)}")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    if shape is not None and (len(shape) != ndim or any(w not in (None, d) for w, d in zip(shape, dims, strict=False))):
        wanted = "(" + ", ".join("N" if w is None else str(w) for w in shape) + ")"
        raise DataError(f"{path}: expected IDX records of shape {wanted}, the header declares {dims}")
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    if expected > max_bytes:
        raise DataError(
            f"{path}: the header declares shape {dims}, {expected} bytes, over the limit of {max_bytes}; not read"
        )
    data = bytearray()  # grows with what arrives: a header's claim alone allocates nothing
    while len(data) < expected:
        chunk = stream.read(min(_CHUNK, expected - len(data)))
        if not chunk:
            raise DataError(f"{path}: truncated: expected {expected} bytes of data, found {len(data)}")
        data += chunk
    trailing = 0
    while trailing <= MAX_TRAILING and (chunk := stream.read(min(_CHUNK, MAX_TRAILING + 1 - trailing))):
        trailing += len(chunk)
    if trailing:
        count = str(trailing) if trailing <= MAX_TRAILING else f"more than {MAX_TRAILING}"
        raise DataError(f"{path}: {count} trailing bytes after the {expected} bytes of data for shape {dims}")
    # Reinterpreted in place rather than copied: big-endian bytes, swapped to native order.
    arr = np.frombuffer(data, dtype=dtype.newbyteorder("=")).reshape(dims)
    if not dtype.isnative:
        arr.byteswap(inplace=True)
    return arr

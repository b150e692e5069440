"""Reading a small JSON object from a file that may come from someone else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UsageError, one_line

MAX_JSON_BYTES = 1 << 20  # configs and checkpoint states are a few kB; refuse to parse anything huge


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

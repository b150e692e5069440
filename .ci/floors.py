"""Print pip constraints that pin every dependency of pyproject.toml to its declared lower bound.

`pip install -c <(python .ci/floors.py) -e .` then installs the oldest releases the project claims
to work with, so the CI floor job tests exactly what pyproject.toml declares (one source of truth).
A dependency without a `>=` bound is left free; one with several conditions keeps only its floor.

torch and torchvision are pinned with `===` (PEP 440's exact match), so that the floor job gets
the public release, never a local build of the same version such as 2.13.0+cpu: such a build sorts
above 2.13.0, so pip takes it wherever an index or find-links offers one, and PyPI's torchvision,
whose operators are compiled against PyPI's torch (the CUDA build), then fails to import beside it
("operator torchvision::nms does not exist").
Their floors in pyproject.toml are therefore written out in full (2.13.0, not 2.13).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")
# Built against each other: pinned to the exact public release (see above).
EXACT = frozenset({"torch", "torchvision"})


def floors(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{distribution name: lower bound} of the project's runtime dependencies."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out: dict[str, str] = {}
    for dep in deps:
        match = _FLOOR.match(dep.split(";")[0])
        if match is None:
            raise ValueError(f"unparsable dependency: {dep!r}")
        name, spec = match.groups()
        for clause in spec.split(","):
            clause = clause.strip()
            if clause.startswith(">="):
                out[name] = clause[2:].strip()
    return out


def main() -> int:
    for name, version in floors().items():
        print(f"{name}{'===' if name in EXACT else '=='}{version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

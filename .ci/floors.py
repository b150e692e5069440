"""Print pip constraints that pin every dependency of pyproject.toml to its declared lower bound.

`pip install -c <(python .ci/floors.py) -e .` then installs the oldest releases the project claims
to work with, so the CI floor job tests exactly what pyproject.toml declares (one source of truth).
A dependency without a `>=` bound is left free; one with several conditions keeps only its floor.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


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
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

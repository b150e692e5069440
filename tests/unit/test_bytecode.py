"""launch/bytecode.py: a package imported where Python may not write its bytecode gets the note, and
the command the note gives makes it go away."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

# Imports a package that only exists in the test's folder, then prints the note about it.
PROBE = "import pkg; from accel_mnist.launch.bytecode import uncached_bytecode_note as n; print(n(pkg))"


def _env(folder: Path) -> dict[str, str]:
    # Without the caller's PYTHONDONTWRITEBYTECODE or PYTHONPYCACHEPREFIX: each test sets what it means.
    return {"PYTHONPATH": f"{folder}:{REPO}", "PATH": "/usr/bin:/bin"}


def _note(folder: Path, *flags: str) -> str:
    proc = subprocess.run([sys.executable, *flags, "-c", PROBE], env=_env(folder), cwd=folder, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_note_names_the_cause_and_its_command_caches_the_bytecode(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("x = 1\n")
    note = _note(tmp_path, "-B")  # -B: what PYTHONDONTWRITEBYTECODE does
    assert note.startswith("pkg's bytecode is not cached (PYTHONDONTWRITEBYTECODE or -B is set)"), note
    command = note.split("`")[1]
    assert command == f"python -m compileall -q {shlex.quote(str(tmp_path))}", note
    subprocess.run([sys.executable, *shlex.split(command)[1:]], env=_env(tmp_path), check=True, timeout=60)
    assert _note(tmp_path, "-B") == "None"  # read from the cache now, though still not allowed to write


def test_no_note_where_python_writes_the_bytecode_itself(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("x = 1\n")
    assert _note(tmp_path) == "None"
    assert list((tmp_path / "pkg" / "__pycache__").glob("__init__.*.pyc"))

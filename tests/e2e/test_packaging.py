"""Packaging: every dependency has a floor, and the CI floor job (`make test-floors`) pins it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11, as .ci/floors.py


def _floors_module():
    spec = importlib.util.spec_from_file_location("floors", REPO / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dependency_has_a_floor_and_the_floor_job_pins_it():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9._-]+", d).group(0) for d in deps]
    floors = _floors_module().floors()
    assert list(floors) == names, "every runtime dependency needs a >= bound for the floor job"
    for dep in deps:
        name = re.match(r"[A-Za-z0-9._-]+", dep).group(0)
        assert f">={floors[name]}" in dep.replace(" ", "")
    pins = subprocess.run([sys.executable, str(REPO / ".ci" / "floors.py")], capture_output=True, text=True, check=True)
    assert pins.stdout.splitlines() == [f"{n}=={v}" for n, v in floors.items()]

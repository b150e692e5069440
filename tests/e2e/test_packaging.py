"""Packaging: every dependency has a floor, the CI floor job (`make test-floors`) pins it, and
every dependency imports at the installed versions, torchvision's download path included."""

from __future__ import annotations

import gzip
import importlib.util
import re
import shutil
import subprocess
import sys

import pytest
import torch

from accel_mnist.data.catalog import download, load_split
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
    exact = _floors_module().EXACT
    assert pins.stdout.splitlines() == [f"{n}{'===' if n in exact else '=='}{v}" for n, v in floors.items()]


# Import names that differ from the distribution's.
_MODULES = {"pillow": "PIL", "pyyaml": "yaml"}
_IMPORT_EACH = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


def test_every_dependency_imports():
    """Each runtime dependency imports in a fresh interpreter, as installed (in the floor job, at
    its floor): a torchvision built for another torch fails here, not in a user's first download."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9._-]+", d).group(0).lower() for d in deps]
    modules = [_MODULES.get(name, name.replace("-", "_")) for name in names]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *modules], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_download_path_runs_through_torchvision_on_files_already_there(tmp_path, mnist_dir):
    """`download` builds torchvision's MNIST class with download=True; with the four IDX files
    already in torchvision's layout (extracted, as its download leaves them) it reads them without
    the network, and reads what accel_mnist reads. (The .gz files here are compressed otherwise
    than the ones torchvision's MD5 sums name, so torchvision would download those again.)"""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for file in sorted(mnist_dir.glob("*-ubyte.gz")):
        with gzip.open(file) as packed, open(raw / file.stem, "wb") as out:
            shutil.copyfileobj(packed, out)
    download("mnist", tmp_path)
    from torchvision.datasets import MNIST

    for train in (True, False):
        theirs = MNIST(str(tmp_path), train=train)
        images, labels = load_split("mnist", mnist_dir, train=train, download=False)
        assert torch.equal(theirs.data, images) and torch.equal(theirs.targets, labels)

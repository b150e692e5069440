"""`package.module:callable` models import alike from the console script and `python -m`: with the current
directory importable, and sys.path left as it was."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_mnist.errors import UsageError
from accel_mnist.memory.estimate import meta_model
from accel_mnist.models import model_from_path

PACKAGE = "beside_the_user"
MODELS = """
from torch import nn


def build():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))


def not_a_model():
    return 3
"""


def write_package(root: Path) -> None:
    """`beside_the_user/models.py` in `root`, as a user's own package sits beside them."""
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "models.py").write_text(MODELS)


@pytest.fixture
def beside(tmp_path, monkeypatch) -> Iterator[Path]:
    """The current directory holds the package, and sys.path (a copy, restored after) does not: as for the
    `accel-mnist` console script, whose sys.path starts with its own folder."""
    write_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_a_model_by_path_imports_from_the_current_directory(beside):
    before = list(sys.path)
    assert importlib.util.find_spec(PACKAGE) is None  # not importable as sys.path stands
    model = model_from_path(f"{PACKAGE}.models:build")
    assert isinstance(model, nn.Sequential) and model[1].in_features == 28 * 28
    assert sys.path == before  # the directory was importable only meanwhile
    on_meta = meta_model(f"{PACKAGE}.models:build")  # what `accel-mnist estimate --model` builds
    assert all(p.device == torch.device("meta") for p in on_meta.parameters())
    assert sys.path == before


@pytest.mark.parametrize("spec, message", [
    (f"{PACKAGE}.models:missing", f"--model {PACKAGE}.models:missing: cannot import it"),
    (f"{PACKAGE}.nowhere:build", f"--model {PACKAGE}.nowhere:build: cannot import it (No module named"),
    (f"{PACKAGE}.models:not_a_model", "not_a_model() returned a int, not a torch.nn.Module"),
])  # fmt: skip
def test_a_model_by_path_that_cannot_be_built_is_one_line(beside, spec, message):
    before = list(sys.path)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as excinfo:
        model_from_path(spec)
    assert "\n" not in str(excinfo.value)
    assert sys.path == before

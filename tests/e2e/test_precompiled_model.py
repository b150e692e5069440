"""A model torch.compile'd before train() is refused in one line, before anything is written: compilation is
the accelerate config's to ask for (dynamo_backend), where the strategy knows of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_mnist import TrainConfig, UsageError, train
from tests.helpers import assert_one_line
from tests.your_model_data import save_hf, splits

pytest.importorskip("datasets")


def _model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def _compiled_in_place() -> nn.Module:
    model = _model()
    model.compile()  # nn.Module.compile: the class stays, its call is compiled
    return model


def _compiled_inside() -> nn.Module:
    model = _model()
    model[1] = torch.compile(model[1])
    return model


@pytest.mark.parametrize(
    ("build", "where"),
    [(lambda: torch.compile(_model()), "the model is"), (_compiled_in_place, "the model is"),
     (_compiled_inside, "its submodule '1' is")],
    ids=["torch.compile", "module.compile", "a compiled submodule"],
)  # fmt: skip
def test_a_compiled_model_is_refused_before_any_output(tmp_path, build, where):
    spec = save_hf(tmp_path / "data", splits(10, 200, 50))
    with pytest.raises(UsageError) as e:
        train(TrainConfig(dataset=spec, max_steps=2, quiet=True, output_dir=str(tmp_path / "run")), model=build())
    assert_one_line(e, f"{where} already torch.compile'd", "dynamo_backend")
    assert not (tmp_path / "run").exists()


def test_the_same_model_uncompiled_trains(tmp_path):
    spec = save_hf(tmp_path / "data", splits(10, 200, 50))
    results = train(TrainConfig(dataset=spec, max_steps=2, quiet=True, plots=False, export=False,
                                output_dir=str(tmp_path / "run")), model=_model())  # fmt: skip
    assert results["steps"] == 2

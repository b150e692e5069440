"""What a run trains on, and what with: the data (the config's dataset, or the caller's own
splits), the model (the registry's, sized to the data's classes, or the caller's), and the
checks that the one takes the other, made before anything is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import is_compiled_module, set_seed
from torch import nn

from ..config import TrainConfig
from ..data.catalog import read_dataset
from ..data.own import own_splits
from ..data.tensor_dataset import build_datasets
from ..distributed.consensus import agree
from ..distributed.option_rules import buffers_change, cast_float_buffers, float_buffers
from ..distributed.prepare import check_model
from ..distributed.strategy import Strategy
from ..errors import UsageError, one_line
from ..model_output import logits_of
from ..models import INPUT_SHAPE, build_model, num_parameters
from ..precision import sixteen_bit_dtype
from .state import RunDescription
from .step import to_memory_format


@dataclass(frozen=True)
class OwnData:
    """What the caller passed to train() besides the config: splits and normalisation, if any."""

    train: Any = None
    test: Any = None
    mean: float | None = None
    std: float | None = None


@dataclass(frozen=True)
class RunData:
    """Both splits, ready for the loaders, and what the run records about them."""

    train: Any
    test: Any
    name: str  # the config's dataset, or "own:<class>" for the caller's splits

    @property
    def state_fields(self) -> dict[str, Any]:
        """The RunDescription fields that describe the data (checked on resume, recorded in exports)."""
        names = self.train.class_names
        return {
            "num_classes": self.train.num_classes,
            "class_names": list(names) if names is not None else None,
            "input_shape": list(self.train.input_shape),
            "train_samples": len(self.train),
        }


def load_run_data(config: TrainConfig, own: OwnData) -> RunData:
    """The run's data: `own`'s splits where given, else the config's dataset; normalised with
    `own`'s mean and std where given."""
    if own.train is None and own.test is None:
        splits = read_dataset(config.dataset, config.data_dir, download=config.download)
        name = config.dataset
    else:
        # Every process on this host holds a copy of its own.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        splits = own_splits(
            own.train, own.test, data_loader=config.data_loader, local_processes=local,
            num_workers=config.num_workers, mean=own.mean, std=own.std,
        )  # fmt: skip
        name = f"own:{type(own.train).__name__}"
    train, test = build_datasets(splits, own.mean, own.std)
    return RunData(train, test, name)


def model_for(accelerator: Accelerator, config: TrainConfig, model: nn.Module | None, data: RunData) -> nn.Module:
    """`model`, checked on a batch of the data, or the registry's `config.model` sized to its classes."""
    shape = tuple(data.train.input_shape)
    if model is None:
        if shape != INPUT_SHAPE:
            raise UsageError(
                f"model {config.model!r} takes {_dims(INPUT_SHAPE)} images but {data.name} has {_dims(shape)}; "
                "pass a model that takes them: train(config, model=...)"
            )
        return build_model(config.model, config.mlp_hidden, data.train.num_classes)
    check_not_compiled(model)
    agree(accelerator, lambda: check_takes(model, data))
    return model


def check_not_compiled(model: nn.Module) -> None:
    """A one-line UsageError if `model`, or a module inside it, is already torch.compile'd.

    Compilation is the launch's to ask for (the accelerate config's dynamo_backend), where the run's strategy
    knows of it: which step it captures (and what it refuses), what results.json and the first line say, and
    prepare compiles after DDP, not inside it. A model compiled beforehand would train with none of that known.
    """
    for name, module in model.named_modules():
        # nn.Module.compile() compiles in place, leaving the class as it was: its compiled call is the mark.
        if is_compiled_module(module) or getattr(module, "_compiled_call_impl", None) is not None:
            where = f"its submodule {name!r}" if name else "the model"
            raise UsageError(
                f"{where} is already torch.compile'd; pass it uncompiled and ask for compilation in the "
                "accelerate config (dynamo_backend, or ACCELERATE_DYNAMO_BACKEND=INDUCTOR)"
            )


def check_takes(model: nn.Module, data: RunData) -> None:
    """A one-line UsageError unless `model` maps two training images to logits of the data's
    width. The forward runs in eval mode, without gradients, on the RNG streams of a fork:
    the model, its buffers and the run's random numbers are as they were."""
    batch = torch.stack([data.train[i][0] for i in range(min(2, len(data.train)))])
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    devices = [device.index or 0] if device.type == "cuda" else []
    was_training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model.eval()
            output = model(batch.to(device))
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise UsageError(
            f"the model fails on images of {data.name} ({_dims(batch.shape[1:])}): {one_line(e)}"
        ) from None
    finally:
        model.train(was_training)
    logits, classes = logits_of(output), data.train.num_classes
    if logits.ndim != 2 or logits.shape[0] != len(batch):
        raise UsageError(
            f"the model returned logits of shape {tuple(logits.shape)} for {len(batch)} images; "
            f"expected ({len(batch)}, {classes})"
        )
    if logits.shape[1] != classes:
        hint = f" (num_labels={classes} in its config)" if hasattr(getattr(model, "config", None), "num_labels") else ""
        raise UsageError(
            f"the model returns {logits.shape[1]} logits per image but {data.name} has {classes} classes; "
            f"give it {classes} outputs{hint}"
        )


@dataclass(frozen=True)
class RunModel:
    """The run's model, as the strategy computes it, and what the run records about it and its data."""

    module: nn.Module
    # What the model and the data say of the run (what an export needs to rebuild the model); the
    # run's length, strategy and config are filled in once they are settled (training/start.py).
    described: RunDescription
    num_parameters: int

    @property
    def facts(self) -> dict[str, Any]:
        """What results.json says about the model and the data."""
        d = self.described
        return {"model": d.model, "dataset": d.dataset, "num_classes": d.num_classes, "class_names": d.class_names,
                "input_shape": d.input_shape, "num_parameters": self.num_parameters}  # fmt: skip


def run_model(
    accelerator: Accelerator, strategy: Strategy, config: TrainConfig, model: nn.Module | None, data: RunData
) -> RunModel:
    """`model` (or the registry's `config.model`) for the data, built or checked under the run's seed, in the
    memory format and buffer dtype the strategy computes in, and refused where the strategy would leave it as
    it is (distributed/prepare.py's check_model)."""
    from ..export.transformers_dir import hf_config

    set_seed(config.seed)  # after the data: a Dataset of the caller's may draw from the RNG as it is read
    name = config.model if model is None else type(model).__name__
    module = model_for(accelerator, config, model, data)
    module = to_memory_format(module, config, strategy)
    if buffers_change(strategy, float_buffers(module)):  # said in the run's changes (training/start.py)
        cast_float_buffers(module, sixteen_bit_dtype(strategy.precision))
    check_model(accelerator, module)
    if accelerator.process_index:  # dropout masks of its own; rank 0 keeps the stream of one process
        set_seed(config.seed, device_specific=True)
    transformers_config = hf_config(module, data.train.class_names)
    described = RunDescription(model=name, dataset=data.name, mean=data.train.mean, std=data.train.std,
                               transformers_config=transformers_config, **data.state_fields)  # fmt: skip
    return RunModel(module, described, num_parameters(module))


def _dims(shape: Any) -> str:
    return "x".join(str(int(d)) for d in shape)

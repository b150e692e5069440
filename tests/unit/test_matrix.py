"""The option matrix's rules and tables (tests/matrix.py, option_rules.py),
without running a cell: the launch and gpu tiers run them."""

from __future__ import annotations

import re
from dataclasses import fields

import torch

from accel_mnist import TrainConfig
from accel_mnist.distributed.option_rules import (
    buffers_change,
    cast_float_buffers,
    channels_last_change,
    float_buffers,
)
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.training.step import to_memory_format
from tests import matrix
from tests.helpers import REPO


def test_the_docs_table_is_the_generated_one():
    text = (REPO / "docs" / "strategies.md").read_text()
    found = re.search(r"<!-- matrix:start -->\n(.*)\n<!-- matrix:end -->", text, re.DOTALL)
    assert found, "docs/strategies.md has no matrix block"
    assert found.group(1) == matrix.tables(["cpu", "cuda"]), "run: python -m tests.matrix"


def test_every_tagged_field_value_is_a_cell_and_configs_build():
    names = {cell.name for cell in matrix.option_cells()}
    tagged = [f for f in fields(TrainConfig) if f.metadata.get("cells")]
    assert {"channels_last", "cuda_graph", "cudnn_benchmark", "prewarm", "grad_accum", "max_grad_norm",
            "optimizer", "scheduler", "data_loader", "mlp_hidden", "report_to"} <= {f.name for f in tagged}  # fmt: skip
    for f in tagged:
        assert any(name.startswith(f"{f.name}=") or f"{f.name}=" in name for name in names), f.name
    assert {"defaults", "own_model", "own_data", "resume"} <= names
    for cell in matrix.option_cells():
        cell.config()  # every cell's settings are a valid TrainConfig


def test_every_shipped_config_is_a_strategy():
    from accel_mnist.shipped import shipped

    yamls = {k.split("/")[1].rsplit(".", 1)[0] for k in shipped() if k.startswith("accelerate_configs/")
             and k.endswith(".yaml")}  # fmt: skip
    assert yamls <= {s.name for s in matrix.strategies()}
    jsons = [s for s in matrix.strategies() if s.launch == ("python",)]
    assert sorted(s.own_optimizer for s in jsons) == [False, True]


def test_channels_last_stays_off_the_parameters_where_they_are_flattened():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3))
    config = TrainConfig(channels_last=True)
    for setup in (Strategy(kind="DEEPSPEED", zero_stage=2), Strategy(kind="FSDP", fsdp_version=2)):
        assert channels_last_change(setup)
        assert to_memory_format(model, config, setup)[0].weight.is_contiguous()
    assert channels_last_change(Strategy(kind="MULTI_GPU", device="cuda")) is None
    to_memory_format(model, config, Strategy())
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_fsdp2_in_16_bits_casts_batchnorm_statistics_and_says_so():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    assert float_buffers(model)
    assert buffers_change(Strategy(kind="FSDP", fsdp_version=2, precision="bf16", device="cuda"), True)
    assert buffers_change(Strategy(kind="FSDP", fsdp_version=2, precision="no", device="cuda"), True) is None
    assert buffers_change(Strategy(kind="FSDP", fsdp_version=1, precision="bf16", device="cuda"), True) is None
    cast_float_buffers(model, torch.bfloat16)
    assert model[1].running_mean.dtype == torch.bfloat16 and model[1].num_batches_tracked.dtype == torch.int64
    assert "running_mean" in dict(model[1].named_buffers())


def test_expectations_name_their_lines():
    cuda_graph = next(c for c in matrix.option_cells() if c.name == "cuda_graph=True")
    zero2 = next(s for s in matrix.strategies() if s.name == "zero2")
    outcome = matrix.expect(zero2, "bf16", "cuda", 1, cuda_graph)
    assert outcome.kind == "changes" and "DEEPSPEED is not captured here" in outcome.lines[0]
    assert matrix.expect(zero2, "fp16", "cpu", 1, cuda_graph).kind == "refuses"
    single = next(s for s in matrix.strategies() if s.name == "single_gpu")
    assert matrix.expect(single, "bf16", "cuda", 1, cuda_graph).kind == "trains"
    assert matrix.expect(single, "fp16", "cuda", 1, cuda_graph).lines[0].startswith("cuda_graph: eager step: fp16")

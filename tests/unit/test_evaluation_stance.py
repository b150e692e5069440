"""`compile_evaluation`: an evaluation of a compiled model compiles its evaluation-mode graph only where asked,
and evaluates to the same numbers either way."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn

from accel_mnist.evaluation import evaluate, evaluation_stance


def test_eager_evaluation_compiles_no_graph_of_its_own() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.BatchNorm1d(10))
    compiled = torch.compile(model, backend=counting)
    compiled.train()
    compiled(torch.randn(8, 1, 28, 28)).sum().backward()
    assert len(graphs) == 1  # the training-mode graph
    loader = [(torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))) for _ in range(2)]
    accelerator = Accelerator(cpu=True)
    try:
        with evaluation_stance(False):
            eager = evaluate(compiled, loader, accelerator)
        assert len(graphs) == 1, "the eager evaluation compiled a graph"
        assert compiled.training  # evaluate() puts the mode back
        with evaluation_stance(True):
            with_graph = evaluate(compiled, loader, accelerator)
        assert len(graphs) == 2  # BatchNorm's evaluation mode is a graph of its own
    finally:
        torch.compiler.reset()
    assert eager["test_samples"] == with_graph["test_samples"] == 32
    assert eager["confusion_matrix"] == with_graph["confusion_matrix"]
    assert abs(eager["test_loss"] - with_graph["test_loss"]) < 1e-6

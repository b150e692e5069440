"""The training configs the repo ships are valid TrainConfigs."""

from __future__ import annotations


def test_the_fast_recipe_file_is_a_valid_training_config():
    from accel_mnist.cli import config_from_args
    from tests.helpers import REPO

    args = type("Args", (), {"config": str(REPO / "recipes" / "fast99.yaml")})()
    recipe = config_from_args(args)  # type: ignore[arg-type]
    assert recipe.model == "bncnn" and recipe.prewarm and not recipe.plots and recipe.stop_at_accuracy == 0.99


def test_the_captured_recipe_is_fast99_with_the_step_captured():
    import yaml

    from accel_mnist.config import TrainConfig
    from tests.helpers import REPO

    recipes = REPO / "recipes"
    plain, graph = (yaml.safe_load((recipes / name).read_text()) for name in ("fast99.yaml", "fast99_graph.yaml"))
    TrainConfig.from_dict(graph)
    # cycle_momentum off: a captured step holds beta1 constant (training/captured_step.py).
    changed = {k: graph[k] for k in graph if plain.get(k) != graph[k]}
    assert changed == {"cycle_momentum": False, "cuda_graph": True, "channels_last": True,
                       "output_dir": "outputs/fast99_graph"}  # fmt: skip


def test_the_compiled_recipe_is_the_captured_one_at_the_measured_settings():
    import yaml

    from accel_mnist.config import TrainConfig
    from tests.helpers import REPO

    recipes = REPO / "recipes"
    graph, compiled = (yaml.safe_load((recipes / name).read_text()) for name in ("fast99_graph.yaml",
                                                                                   "fast99_compiled.yaml"))  # fmt: skip
    TrainConfig.from_dict(compiled)
    # What the 20 fresh commands of benchmarks/results/h100-2026-12-07-bytecode ran: --lr 0.02 --cudnn-benchmark
    # --no-compile-evaluation.
    defaults = TrainConfig().to_dict()  # a key fast99_graph.yaml leaves out has the default there
    changed = {k: compiled[k] for k in compiled if graph.get(k, defaults[k]) != compiled[k]}
    assert changed == {"lr": 0.02, "cudnn_benchmark": True, "compile_evaluation": False,
                       "output_dir": "outputs/fast99_compiled"}  # fmt: skip

"""The training configs the repo ships are valid TrainConfigs."""

from __future__ import annotations


def test_the_fast_recipe_file_is_a_valid_training_config():
    from accel_mnist.cli import config_from_args
    from tests.helpers import REPO

    args = type("Args", (), {"config": str(REPO / "recipes" / "fast99.yaml")})()
    recipe = config_from_args(args)  # type: ignore[arg-type]
    assert recipe.model == "bncnn" and recipe.prewarm and not recipe.plots and recipe.stop_at_accuracy == 0.99

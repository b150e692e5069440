"""TrainConfig: defaults, validation, and loading from YAML/JSON files and flags."""

from __future__ import annotations

import json

import pytest

from accel_mnist import TrainConfig
from accel_mnist.cli import build_parser, config_from_args
from accel_mnist.config import load_config_file
from accel_mnist.errors import ConfigError


def parse(argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_defaults_are_valid():
    config = TrainConfig()
    assert config.model == "cnn" and config.batch_size == 64
    assert config.grad_accum is None  # unset: build_accelerator takes the launcher's value, else 1


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"model": "resnet"}, "model"),
        ({"dataset": "cifar10"}, "dataset"),
        ({"optimizer": "lamb"}, "optimizer"),
        ({"scheduler": "poly"}, "scheduler"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": -1}, "batch_size"),
        ({"grad_accum": 0}, "grad_accum"),
        ({"max_steps": 0}, "max_steps"),
        ({"lr": 0.0}, "lr"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"eval_every": -5}, "eval_every"),
        ({"step_gamma": 1.5}, "step_gamma"),
        ({"batch_size": "auto", "max_batch_size": 0}, "max_batch_size"),
        ({"batch_size": 64, "max_batch_size": 128}, "max_batch_size"),  # a bound for `auto` alone
        ({"batch_size": "auto", "global_batch_size": 0}, "global_batch_size"),
        ({"batch_size": 64, "global_batch_size": 256}, "global_batch_size"),  # auto chooses the micro-batch
        ({"batch_size": "auto", "global_batch_size": 256, "grad_accum": 2}, "global_batch_size"),  # and accumulation
    ],
)
def test_bad_values_name_the_key(changes, key):
    with pytest.raises(ConfigError, match=rf"^{key}:"):
        TrainConfig(**changes)


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(ConfigError, match="unknown key 'batchsize'"):
        TrainConfig.from_dict({"batchsize": 32})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"epochs": "two"}, "epochs: expected int"),
        ({"epochs": 1.5}, "epochs: expected int"),
        ({"lr": "fast"}, "lr: expected float"),
        ({"overwrite": "maybe"}, "overwrite: expected bool"),
        ({"model": ["cnn"]}, "model: expected str"),
        ({"batch_size": None}, "batch_size: must not be null"),
    ],
)
def test_wrong_types_are_rejected(values, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict(values)


def test_optional_fields_take_null():
    config = TrainConfig.from_dict({"max_steps": None, "max_grad_norm": "none"})
    assert config.max_steps is None and config.max_grad_norm is None


def test_yaml_and_json_files_load(tmp_path):
    (tmp_path / "c.yaml").write_text("model: linear\nbatch_size: 128\nlr: 3.0e-4\nscheduler: onecycle\n")
    (tmp_path / "c.json").write_text(json.dumps({"model": "mlp", "epochs": 3}))
    assert parse(["--config", str(tmp_path / "c.yaml")]) == TrainConfig(
        model="linear", batch_size=128, lr=3e-4, scheduler="onecycle"
    )
    assert parse(["--config", str(tmp_path / "c.json")]) == TrainConfig(model="mlp", epochs=3)


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: linear\nbatch_size: 128\nquiet: true\n")
    config = parse(["--config", str(path), "--batch-size", "32", "--no-quiet", "--max-grad-norm", "1.0"])
    assert (config.model, config.batch_size, config.quiet, config.max_grad_norm) == ("linear", 32, False, 1.0)


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: linear\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key 'learning_rate'"):
        parse(["--config", str(path)])


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("bad.yaml", "model: [cnn\n", "not valid YAML"),
        ("bad.json", "{model: cnn}", "not valid JSON"),
        ("list.yaml", "- a\n- b\n", "expected a mapping"),
        ("python.yaml", "model: !!python/object/apply:os.system ['echo owned']\n", "not valid YAML"),
    ],
)
def test_bad_config_files(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config_file(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "nope.yaml")


def test_config_takes_a_shipped_recipe_by_the_names_the_listing_shows(tmp_path, monkeypatch, capsys):
    """`--config fast99` as `accel-mnist configs` lists it; a file of that name wins; neither: one line."""
    import yaml

    from accel_mnist.cli import main
    from tests.helpers import REPO

    monkeypatch.chdir(tmp_path)  # no recipes/ folder here: the names reach the shipped files
    recipe = yaml.safe_load((REPO / "recipes" / "fast99.yaml").read_text())
    for name in ("fast99", "fast99.yaml", "recipes/fast99", "recipes/fast99.yaml"):
        assert load_config_file(name) == recipe, name
    assert parse(["--config", "fast99"]).model == recipe["model"]
    (tmp_path / "fast99").write_text("model: linear\n")
    assert parse(["--config", "fast99"]).model == "linear"
    assert main(["train", "--config", "zero2"]) == 2  # an accelerate config, not a recipe
    err = capsys.readouterr().err
    assert err.startswith("error: config file zero2 does not exist, and no recipe named 'zero2' (known: fast99,")
    assert err.count("\n") == 1


def test_empty_file_means_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert parse(["--config", str(path)]) == TrainConfig()


def test_every_field_has_a_flag():
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name in TrainConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in help_text

"""Packaging: `accel-mnist configs` lists and prints the files the package ships."""

from __future__ import annotations

import re

from accel_mnist.cli import main
from tests.helpers import CONFIGS, shipped_files


def test_configs_lists_every_file_and_prints_one_unchanged(capsys):
    assert main(["configs"]) == 0
    listing = capsys.readouterr().out
    for file in shipped_files():
        assert re.search(rf"^  (recipes/|accelerate_configs/)?{file.stem}\b", listing, re.M), file.name
    names = [("zero2", "zero2.yaml"), ("zero2.yaml", "zero2.yaml"), ("accelerate_configs/zero2", "zero2.yaml"),
             ("deepspeed_config.json", "deepspeed_config.json")]  # fmt: skip
    for name, file in names:
        assert main(["configs", name]) == 0
        assert capsys.readouterr().out == (CONFIGS / file).read_text(), name


def test_configs_unknown_name_is_one_error_line(capsys):
    assert main(["configs", "zero9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no config named 'zero9'") and "zero2" in err and err.count("\n") == 1

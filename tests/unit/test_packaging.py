"""Packaging: `accel-mnist configs` lists and prints the files the package ships."""

from __future__ import annotations

import re

import pytest

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


@pytest.mark.parametrize("columns", [80, 120])
def test_configs_lists_whole_first_sentences_within_the_terminal(capsys, monkeypatch, columns):
    """Each description is its header's first sentence, whole, wrapped under its column to the width."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= columns
    entries: dict[str, str] = {}
    name = ""
    for line in lines:
        if line.startswith("   "):  # a description's next line, under its column
            entries[name] += " " + line.strip()
        elif line.startswith("  "):
            name, _, text = line.strip().partition(" ")
            entries[name] = text.strip()
    for file in shipped_files():
        said = entries[file.stem]
        if file.suffix == ".json":
            assert said == "(JSON)"
            continue
        header = " ".join(line.lstrip("#").strip() for line in file.read_text().splitlines()[:3])
        assert said.endswith(".") and header.startswith(said), (file.name, said)
    assert entries["cpu"] == "Single process on the CPU, no distribution, full fp32."
    assert entries["fsdp"].endswith("(use_orig_params: true; false works too).")

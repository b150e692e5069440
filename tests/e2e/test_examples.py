"""The scripts in examples/ run as a user would run them, with quick settings."""

from __future__ import annotations

import json

from tests.helpers import run_example


def test_custom_model(tmp_path, mnist_dir):
    out = run_example("custom_model.py", "--max-steps", "60", "--output-dir", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "MyNet" and results["steps"] == 60
    assert results["num_parameters"] == 8 * 9 + 8 + 8 * 14 * 14 * 10 + 10
    assert results["test_accuracy"] > 0.8  # 0.90 after 100 steps, about 0.85 after 60
    assert f"test accuracy {results['test_accuracy']:.4f}" in out


def test_custom_dataset(tmp_path):
    out = run_example("custom_dataset.py", "--out", str(tmp_path / "stripes"), "--train-size", "2000",
                      "--test-size", "500", "--max-steps", "40", "--output-dir", str(tmp_path / "run"))  # fmt: skip
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["dataset"] == f"hf:{tmp_path / 'stripes'}" and results["steps"] == 40
    assert results["test_accuracy"] > 0.9 and "test accuracy" in out

"""torch.compile's inductor on the CPU trains as the eager step does: the same losses over a few steps
(a compiled step that computed something else, or a compiled model that evaluation or the export did not
unwrap, shows here). On a GPU the compiled model's step is captured too: tests/gpu/test_cuda_graph.py."""

from __future__ import annotations

import json

import pytest

from tests.helpers import metrics_rows, run_accel_mnist

RUN = ["train", "--model", "bncnn", "--max-steps", "4", "--batch-size", "32", "--eval-every", "2",
       "--quiet", "--no-plots", "--no-save-checkpoints"]  # fmt: skip


@pytest.mark.slow
def test_the_compiled_step_trains_as_the_eager_one(tmp_path, mnist_dir):
    rows, results = {}, {}
    for backend in ("NO", "INDUCTOR"):
        out = tmp_path / backend
        proc = run_accel_mnist(*RUN, "--output-dir", str(out), env={"ACCELERATE_DYNAMO_BACKEND": backend})
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows[backend], results[backend] = metrics_rows(out), json.loads((out / "results.json").read_text())
    assert (results["NO"]["dynamo_backend"], results["INDUCTOR"]["dynamo_backend"]) == ("no", "inductor")
    assert results["INDUCTOR"]["dynamo_mode"] == "default"
    assert [r["step"] for r in rows["INDUCTOR"]] == [r["step"] for r in rows["NO"]] == [2, 4]
    for compiled, eager in zip(rows["INDUCTOR"], rows["NO"], strict=True):
        # Measured equal to the printed digits on one CPU (inductor's C++ kernels against aten's); a step
        # that went wrong moves the loss by far more than this.
        for key in ("train_loss", "test_loss", "test_accuracy"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-4, abs=1e-6), key
    # The exported weights are the model's own, not the compiled wrapper's ("_orig_mod." keys).
    from safetensors.torch import load_file

    names, eager_names = (set(load_file(str(tmp_path / b / "model.safetensors"))) for b in ("INDUCTOR", "NO"))
    assert names == eager_names and not any("_orig_mod" in n for n in names)

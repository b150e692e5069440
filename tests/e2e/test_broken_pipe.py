"""A reader that goes away early (`accel-mnist predict ... | head`) ends the command quietly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from accel_mnist.export.model_dir import save_exported
from accel_mnist.models import build_model
from tests.helpers import write_idx


def test_predict_into_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    model = build_model("linear")
    save_exported(model.state_dict(), tmp_path / "export", model_name="linear", dataset="mnist")
    # 10000 records, a line of output each: more than a pipe holds (64 KiB on Linux).
    images = write_idx(tmp_path / "images-idx3-ubyte", np.zeros((10000, 28, 28), dtype=np.uint8))
    predict = subprocess.Popen(
        [sys.executable, "-m", "accel_mnist", "predict", "--model-path", str(tmp_path / "export"), str(images)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert predict.stdout is not None and predict.stderr is not None
    first = predict.stdout.readline()
    predict.stdout.close()  # as `head -1` does
    err = predict.stderr.read().decode()
    assert predict.wait(timeout=120) == 141, err
    assert first.strip() and "Traceback" not in err and "BrokenPipeError" not in err, err

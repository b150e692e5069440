"""A reader that goes away early (`accel-mnist predict ... | head`) ends the command quietly."""

from __future__ import annotations

import subprocess
import sys

from accel_mnist.export.model_dir import save_exported
from accel_mnist.models import build_model
from tests.helpers import MNIST_DIR


def test_predict_into_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    model = build_model("linear")
    save_exported(model.state_dict(), tmp_path / "export", model_name="linear", dataset="mnist")
    images = MNIST_DIR / "t10k-images-idx3-ubyte.gz"  # 10000 lines of output: more than a pipe holds
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

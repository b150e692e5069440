"""accel_mnist.data.catalog on the real MNIST files, and its import in a fresh interpreter."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys

from accel_mnist.data.catalog import load_datasets


def test_import_does_not_import_torchvision():
    code = "import sys, accel_mnist.data.catalog; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- real data --------------------------------------------------------------------------------


def test_real_mnist(mnist_dir):
    labels_gz = mnist_dir / "t10k-labels-idx1-ubyte.gz"
    assert hashlib.md5(gzip.decompress(labels_gz.read_bytes())).hexdigest() == "27ae3e4e09519cfbb04c329615203637"
    train, test = load_datasets("mnist", mnist_dir, download=False)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.images.shape == (60000, 28, 28) and test.labels.shape == (10000,)
    assert int(train.labels.min()) == 0 and int(train.labels.max()) == 9
    assert test.labels[:5].tolist() == [7, 2, 1, 0, 4]
    x, y = train[0]
    assert x.shape == (1, 28, 28) and int(y) == 5

"""The process that draws a run's PNGs in the background imports matplotlib, not torch."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")


def test_the_background_plot_process_does_not_import_torch():
    """draw_in_background's process imports accel_mnist.report alone: matplotlib, not torch."""
    import subprocess
    import sys

    import accel_mnist

    assert sorted(accel_mnist.__all__) == sorted(accel_mnist._EXPORTS)
    code = "import sys, accel_mnist.report; print('torch' in sys.modules, 'accelerate' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

"""draw_in_background's process: `python -m accel_mnist.report RUN_DIR` writes the run's PNGs."""

import sys

from . import write_report

write_report(sys.argv[1])

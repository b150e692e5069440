"""`python -m accel_mnist` and `accelerate launch -m accel_mnist`."""

import gc
import sys

# No collections while torch and accelerate are imported: each full one walks every object they
# have made so far. cli.main turns the collector back on once they are in (settle_collector).
gc.disable()

from .cli import main  # noqa: E402

sys.exit(main())

"""`python -m accel_mnist` and `accelerate launch -m accel_mnist`."""

import sys

from .cli import main

sys.exit(main())

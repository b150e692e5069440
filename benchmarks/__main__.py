"""`python -m benchmarks SUITE`: see benchmarks/runner.py and the suites in benchmarks/suites.py."""

import sys

from benchmarks.runner import main

sys.exit(main())

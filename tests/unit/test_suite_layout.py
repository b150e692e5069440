"""How the suite itself is laid out for `make test` (pytest-xdist, --dist loadgroup)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_a_module_with_shared_runs_stays_on_one_worker():
    # A module- or class-scoped fixture is set up once per worker that runs the module's tests:
    # without its own xdist_group, the runs it makes would be made again on the other worker.
    shared = re.compile(r'@pytest\.fixture\(scope="(module|class)"')
    missing = []
    for path in sorted(TESTS.glob("*/test_*.py")):
        text = path.read_text()
        name = path.relative_to(TESTS).as_posix()
        if shared.search(text) and f'xdist_group("{name}")' not in text:
            missing.append(name)
    assert not missing, f"add pytestmark = pytest.mark.xdist_group(<its path under tests/>) to {missing}"

"""The pair matrix's CPU cells (tests/pairs.py `groups("cpu")`): every pair of option values
meets in a cell under each strategy, precision and process count of the option matrix's CPU
groups that run. One launch a group, two launches at a time (2 cores), each cell compared with
what the option matrix's rules say it does. Synthetic data, two steps a cell."""

from __future__ import annotations

import pytest

from tests.matrix_worker import check_groups
from tests.pairs import groups


@pytest.mark.slow
def test_every_pair_cell_trains_changes_with_a_line_or_refuses_in_one(tmp_path):
    # The two-process groups first: started last, they would end alone on the two cores.
    ordered = sorted(groups("cpu"), key=lambda group: -group[2])
    _seen, wrong = check_groups(ordered, "cpu", tmp_path, parallel=2, table="pairs")
    if any("expected crashes" in line for line in wrong):
        wrong.append("a KNOWN_FAILURES pair of tests/pairs.py that no longer fails so: remove its entry")
    assert not wrong, "\n".join(wrong)

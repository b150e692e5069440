"""The option matrix's CPU cells (accel_mnist/distributed/matrix.py `groups("cpu")`): one launch per
strategy, precision and process count, every option a cell inside it, each compared with what the
rules the runtime applies say it does. Synthetic data, two steps a cell."""

from __future__ import annotations

import pytest

from accel_mnist.distributed.matrix import groups
from tests.matrix_worker import check_groups

GROUPS = groups("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS, ids=[f"{s.name}-{p}-{n}p".replace(" ", "_") for s, p, n in GROUPS])
def test_each_cell_trains_changes_with_a_line_or_refuses_in_one(group, tmp_path):
    _seen, wrong = check_groups([group], "cpu", tmp_path)
    assert not wrong, "\n".join(wrong)

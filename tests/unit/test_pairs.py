"""The pair matrix (tests/pairs.py) without running a cell: its parameters are the option
matrix's cells, and every pair of option values meets, by enumeration, in a cell expected to run
under each group that runs. The launch and gpu tiers run the cells."""

from __future__ import annotations

import itertools
import re

import pytest

from tests import matrix, pairs
from tests.helpers import REPO
from tests.matrix_worker import matches

DEVICES = ("cpu", "cuda")


def value_pairs() -> set[tuple[str, str]]:
    """Every pair of values of two parameters, by name, in parameters() order."""
    params = pairs.parameters()
    return {
        (a.name, b.name) for p, q in itertools.combinations(params, 2) for a, b in itertools.product(p.values, q.values)
    }


def held(cells) -> set[tuple[str, str]]:
    """The pairs of value names `cells` hold together."""
    found = set()
    for cell in cells:
        found |= set(itertools.combinations([value.name for value in cell.values], 2))
    return found


def test_the_parameters_are_the_option_matrix_cells():
    params = pairs.parameters()
    names = [cell.name for p in params for cell in p.values]
    assert len(names) == len(set(names))
    options = {cell.name for cell in matrix.option_cells()} - {"defaults"}
    assert options <= set(names), options - set(names)
    assert set(names) - options == {p.values[0].name for p in params}  # the rest are the defaults
    for p in params:
        assert p.values[0].settings == ()
        assert all(cell.config() for cell in p.values)  # each a valid TrainConfig alone
    by_name = {p.name: [cell.name for cell in p.values] for p in params}
    assert "model=mlp,mlp_hidden=64,32" in by_name["model"] and "own_model" in by_name["model"]
    assert "scheduler=onecycle,cycle_momentum=False" in by_name["scheduler"]
    assert "data_loader=torch,num_workers=1" in by_name["data_loader"]
    assert by_name["own_data"] == ["own_data=no", "own_data"] and by_name["resume"] == ["resume=no", "resume"]


def test_the_groups_run_and_are_the_option_matrix_groups():
    assert pairs.groups("cuda") == matrix.groups("cuda")
    cpu = pairs.groups("cpu")
    assert {(s.name, p, n) for s, p, n in cpu} == set(pairs.CPU_GROUPS)
    assert all(g in matrix.groups("cpu") for g in cpu)
    defaults = matrix.Cell("defaults")
    for device in DEVICES:
        assert all(matrix.expect(s, p, device, n, defaults).kind != "refuses" for s, p, n in pairs.groups(device))
    # One group a way of setting up the step on the CPU (the module's docstring).
    kinds = {(matrix.launch_kind(s, n), p, n, s.zero_stage, s.own_optimizer, s.dynamo) for s, p, n in cpu}
    assert len(kinds) == len(cpu)
    assert {"NO", "MULTI_CPU", "DEEPSPEED"} == {k[0] for k in kinds} and any(k[5] for k in kinds)


@pytest.mark.parametrize("device", DEVICES)
def test_every_pair_of_values_meets_in_a_cell_that_runs_under_every_group(device):
    wanted = value_pairs()
    known = set(pairs.KNOWN_FAILURES) | set(pairs.PAIR_REFUSALS)
    assert known < wanted
    values = [value for param in pairs.parameters() for value in param.values]
    for s, p, n in pairs.groups(device):
        outcomes = [(cell, pairs.expect(s, p, device, n, cell)) for cell in pairs.pair_cells()]
        runs = [cell for cell, outcome in outcomes if outcome.kind in ("trains", "changes")]
        # A value refused alone under this group (REFUSED_IN_SOME_GROUPS) has no pair to hold here.
        refused = {v.name for v in values if matrix.expect(s, p, device, n, v).kind == "refuses"}
        assert refused <= set(pairs.REFUSED_IN_SOME_GROUPS)
        missing = {pair for pair in wanted if not set(pair) & refused} - held(runs)
        # Only a pair kept apart is left, where it refuses or fails (a JSON's own optimizer avoids it).
        assert missing <= known, f"{s.name} {p} {n}p: {sorted(missing)[:5]}"
        assert not missing or not s.own_optimizer
        assert all(o.kind in ("trains", "changes") or cell.apart or {v.name for v in cell.values} & refused
                   for cell, o in outcomes)  # fmt: skip


def test_a_cell_fewer_leaves_a_pair_uncovered():
    """The check above can fail: each row of the greedy array holds a pair no earlier row does."""
    cells = [cell for cell in pairs.pair_cells() if not cell.apart]
    wanted = value_pairs() - set(pairs.KNOWN_FAILURES) - set(pairs.PAIR_REFUSALS)
    assert held(cells) >= wanted
    assert not held(cells[:-1]) >= wanted
    for i in range(len(cells)):
        assert held(cells[: i + 1]) - held(cells[:i]), f"row {i} adds no pair"


def test_the_array_is_small_and_the_same_each_time():
    params = pairs.parameters()
    sizes = sorted((len(p.values) for p in params), reverse=True)
    cells = [cell for cell in pairs.pair_cells() if not cell.apart]
    partial = [cell for cell in cells if {v.name for v in cell.values} & set(pairs.REFUSED_IN_SOME_GROUPS)]
    array = len(cells) - len(partial)
    assert sizes[0] * sizes[1] <= array <= sizes[0] * sizes[1] + 8  # a pair of the two largest a row
    # Each value refused in some groups pairs with every other value in as few cells as the largest parameter.
    assert len(partial) <= sizes[0] * len(pairs.REFUSED_IN_SOME_GROUPS)
    sizes = [len(p.values) for p in params]
    assert pairs.covering_array(sizes) == pairs.covering_array(sizes)
    assert pairs.covering_array(sizes, seed=1) != pairs.covering_array(sizes)


def test_the_covering_array_alone():
    rows = pairs.covering_array([3, 2, 2, 2])
    assert set().union(*(pairs.pairs_of(r) for r in rows)) == pairs.all_pairs([3, 2, 2, 2])
    forbidden = frozenset({(0, 2, 1, 1), (2, 0, 3, 0)})
    rows = pairs.covering_array([3, 2, 2, 2], forbidden)
    found = set().union(*(pairs.pairs_of(r) for r in rows))
    assert not found & forbidden and found == pairs.all_pairs([3, 2, 2, 2]) - forbidden
    with pytest.raises(ValueError, match="no value"):  # value 0 of the first goes with no value of the second
        pairs.covering_array([2, 2, 2], frozenset({(0, 0, 1, 0), (0, 0, 1, 1)}))


def test_a_pair_that_refuses_together_is_out_of_the_array_and_in_a_cell_of_its_own():
    """adadelta with onecycle: torch's OneCycleLR stopped mid-setup with a ValueError traceback (the
    pair matrix found it); the launch now refuses the pair in one line, the runtime's own."""
    cells = pairs.pair_cells()
    for pair, line in pairs.PAIR_REFUSALS.items():
        assert line and pair not in held(cell for cell in cells if not cell.apart)
        assert [cell.refusal for cell in cells if cell.apart and pair in held([cell])] == [line]
    strategies = {s.name: s for s in matrix.strategies()}
    cell = next(cell for cell in cells if cell.refusal)
    assert pairs.expect(strategies["cpu"], "no", "cpu", 1, cell) == matrix.Outcome("refuses", (cell.refusal,))
    assert matches(pairs.expect(strategies["cpu"], "no", "cpu", 1, cell), {"kind": "refuses", "lines": [cell.refusal]})
    assert not matches(pairs.expect(strategies["cpu"], "no", "cpu", 1, cell), {"kind": "crashes", "lines": ["x"]})
    # A DeepSpeed JSON with its own optimizer builds neither of the config's: the pair trains there.
    own = strategies["zero_file_optim_sched"]
    assert pairs.expect(own, "no", "cpu", 1, cell).kind in ("trains", "changes")
    crash = pairs.PairCell(cell.values, cell.defaults, known_failure="ValueError: x")
    trace = "Traceback (most recent call last):\n  ...\nValueError: x\n"
    assert matches(pairs.expect(strategies["cpu"], "no", "cpu", 1, crash), {"kind": "crashes", "lines": [trace]})


@pytest.mark.parametrize("device", DEVICES)
def test_a_cell_refuses_as_its_values_do_and_otherwise_prints_their_lines(device):
    """Where each rule reads one option, a cell's lines are its values' lines together; the
    cuda_graph rule reads the whole config and names one reason."""
    for s, p, n in matrix.groups(device):
        for cell in (cell for cell in pairs.pair_cells() if not cell.apart):
            want = pairs.expect(s, p, device, n, cell)
            alone = [
                matrix.expect(s, p, device, n, v) for v, d in zip(cell.values, cell.defaults, strict=True) if not d
            ]
            if any(o.kind == "refuses" for o in alone):
                assert want == next(o for o in alone if o.kind == "refuses")
                continue
            lines = {line for o in alone for line in o.lines}
            if "cuda_graph=True" in cell.name:
                ours = [line for line in want.lines if line.startswith("cuda_graph: ")]
                assert len(ours) <= 1 and set(want.lines) - set(ours) == lines - {
                    line for line in lines if line.startswith("cuda_graph: ")
                }
            else:
                assert set(want.lines) == lines, f"{s.name} {p} {cell.name}"


def test_the_docs_hold_the_current_sizes():
    text = (REPO / "docs" / "strategies.md").read_text()
    found = re.search(r"<!-- pairs:start -->\n(.*)\n<!-- pairs:end -->", text, re.DOTALL)
    assert found, "docs/strategies.md has no pairs block"
    assert found.group(1) == pairs.headline(list(DEVICES)), "run: python -m tests.pairs --docs"

"""The pair matrix: every pair of option values together in a cell that runs, under each
strategy and precision a device runs. The option matrix (tests/matrix.py) varies one option at
a time, so it cannot see a failure that needs two options at once (prewarm with a BatchNorm
model under FSDP2 in bf16 crashed while each alone trained).

Parameters. One per option, built from the option matrix's own cells: each TrainConfig field
whose metadata holds `cells`, with the fields whose cells set each other's keys merged into one
parameter (mlp_hidden's cell sets `model`, so it is a value of `model`; cycle_momentum's sets
`scheduler`; num_workers's sets `data_loader`). A parameter's values are its default and each
cell of its fields. The ways of running that are not fields (matrix.EXTRA_CELLS) join in: your
own model is one more value of `model` (it replaces the registry's), your own data and a resume
are parameters of two values each. So each model, bncnn's BatchNorm buffers among them, meets
every other option value.

Cells. A seeded greedy covering array in the manner of AETG (Cohen et al., 1997): each row
starts from the parameter value that is in the most pairs not yet covered, takes the other
parameters in a shuffled order and gives each the value that covers the most uncovered pairs
with the values chosen so far; of CANDIDATES such rows the one covering the most is kept, until
every pair is covered. The seed makes it the same array everywhere, and each row covers a pair
no earlier row covers. `python -m tests.pairs` prints the sizes per group; tests/unit/test_pairs.py
checks the coverage by enumerating every pair under every group.

Pairs kept apart. A pair of values that refuses together where each alone trains
(PAIR_REFUSALS: adadelta has no momentum for onecycle to cycle) would hide every other pair of
the row it falls in, and so would one that fails with a traceback (KNOWN_FAILURES, none now); no
row of the array holds such a pair. A cell of its own holds the two values, expected to refuse
with the runtime's line, or, for a known failure, to fail as it does now (the test fails once it
is fixed, so that the pair goes back into the array).

Values refused in some groups. A value that refuses alone under some strategies and runs under the
others (REFUSED_IN_SOME_GROUPS: `ema_decay` under ZeRO-3 and FSDP) stays out of the array too, whose
cells would refuse there and take their other pairs with them. Cells of its own, after the array,
pair it with every value of every other parameter (as few as the largest parameter has values);
where it refuses they refuse with its line, and elsewhere they run like the rest.

Groups. The whole array runs in each group (a strategy, precision and process count: one
launch) that it runs in, so every pair of option values meets under each such group: each
(value, value, group) triple is covered. On a GPU those are all the option matrix's groups,
every strategy at each precision with one process (tests/gpu/test_pairs.py). On the CPU the
launch tier has minutes: the option matrix's 20 CPU groups whose cells run would take over
twelve minutes of both cores for the pair cells (a cell under DeepSpeed takes seconds there), so
CPU_GROUPS keeps one group for each way the CPU's strategies set up the step: one process in
fp32 and under bf16 autocast, DDP over two processes, dynamo, DeepSpeed in bf16 (16-bit weights
and buffers, ZeRO-2), ZeRO-3 partitioning the parameters over two processes, and a DeepSpeed
JSON with its own optimizer and schedule (which the config's optimizer and scheduler then
meet). The CPU's other groups set up one of these again under another file or stage (zero1,
zero2, multinode_zero2 and zero_file are the ZeRO-2 engine in fp32, the offload configs the same
engines with the optimizer's step on the host); their triples are covered on the GPU, where the
pair cells run under every group, and each of their single options runs on the CPU in the option
matrix. Groups that refuse every cell (fp16 and FSDP on the CPU) run none and hold no pair; the
option matrix checks their one line.

Expected outcome. A cell refuses when any of its values refuses alone under the group (the
option matrix's expectation, with its line). Otherwise the option matrix's rules read the cell's
whole config: its lines are the union of its options' lines where a rule reads one option
(channels_last, the FSDP2 buffers), and the cuda_graph rule, which reads the whole config, names
the first reason capture does not hold (with grad_accum=2 and sgd it names the accumulation,
though sgd alone would name sgd). Anything else, a traceback above all, fails the test.
"""

from __future__ import annotations

import functools
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from accel_mnist.config import TrainConfig
from accel_mnist.optim import schedule_refusal
from tests import matrix

SEED = 2024
CANDIDATES = 24  # rows tried for each row kept

# The CPU groups the pair cells run in (see the module's docstring): (strategy, precision, processes).
CPU_GROUPS = (
    ("cpu", "no", 1),
    ("cpu", "bf16", 1),
    ("multi_cpu", "no", 2),
    ("dynamo", "no", 1),
    ("multinode_zero2", "bf16", 1),
    ("zero3", "no", 2),
    ("zero_file_optim_sched", "no", 1),
)

# Pairs of values that refuse together, in one line, where each alone trains: {(value, value): the line}.
# Each is kept out of the array and run in a cell of its own (see the docstring).
PAIR_REFUSALS = {
    # torch's OneCycleLR cycles momentum by default (cycle_momentum: true), and Adadelta has none.
    ("optimizer=adadelta", "scheduler=onecycle"): schedule_refusal(
        TrainConfig(optimizer="adadelta", scheduler="onecycle")
    ),
}
# Values that refuse alone under some groups and run under the others: their pairs are held by cells of
# their own, after the array (pair_cells); the option matrix checks the refusal's line.
REFUSED_IN_SOME_GROUPS = ("ema_decay=0.9",)  # ZeRO-3 and FSDP (option_rules.averaging_refusal)
# Pairs of values that fail with a traceback where a run should train or refuse in one line:
# {(value, value): the last line of the traceback}, kept apart alike; remove an entry once the pair
# trains or refuses. The pair matrix found one (the pair above, then a ValueError from torch).
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Parameter:
    """One option as the pair matrix varies it: its values, the default first."""

    name: str
    values: tuple[matrix.Cell, ...]


def parameters() -> list[Parameter]:
    """The options of the option matrix as parameters: `model`, `optimizer`, ..., `own_data`, `resume`."""
    merged: list[list[tuple[tuple[str, Any], ...]]] = []  # each parameter's cells, as settings
    keys: list[set[str]] = []  # the keys each parameter's cells set
    for f in fields(TrainConfig):
        cells = [_settings(f.name, value) for value in f.metadata.get("cells", ())]
        if not cells:
            continue
        touched = {key for settings in cells for key, _ in settings}
        for i in reversed([i for i, known in enumerate(keys) if known & touched]):
            cells = merged.pop(i) + cells  # fields whose cells set the same keys are one parameter
            touched |= keys.pop(i)
        merged.append(cells)
        keys.append(touched)
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    found = []
    for cells in merged:
        every = set.intersection(*({key for key, _ in settings} for settings in cells))
        name = next(key for settings in cells for key, _ in settings if key in every)  # the key all cells set
        values = [matrix.Cell(f"{name}={defaults[name]}")]
        values += [matrix.Cell(",".join(f"{k}={v}" for k, v in settings), settings) for settings in cells]
        if name == "model":
            values.append(matrix.Cell("own_model"))
        found.append(Parameter(name, tuple(values)))
    for extra in ("own_data", "resume"):
        found.append(Parameter(extra, (matrix.Cell(f"{extra}=no"), matrix.Cell(extra))))
    return found


def _settings(name: str, value: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(value.items()) if isinstance(value, dict) else ((name, value),)


Row = tuple[int, ...]  # a value index per parameter
Pair = tuple[int, int, int, int]  # (parameter i, its value a, parameter j > i, its value b)


def all_pairs(sizes: Sequence[int]) -> set[Pair]:
    """Every pair of values of two parameters, of `sizes` values each."""
    k = len(sizes)
    return {(i, a, j, b) for i in range(k) for j in range(i + 1, k) for a in range(sizes[i]) for b in range(sizes[j])}


def pairs_of(row: Row) -> set[Pair]:
    """The pairs one row holds."""
    return {(i, row[i], j, row[j]) for i in range(len(row)) for j in range(i + 1, len(row))}


def _pair(i: int, a: int, j: int, b: int) -> Pair:
    """Value a of parameter i with value b of parameter j, as all_pairs writes it (i < j)."""
    return (i, a, j, b) if i < j else (j, b, i, a)


def covering_array(
    sizes: Sequence[int],
    forbidden: frozenset[Pair] = frozenset(),
    seed: int = SEED,
    candidates: int = CANDIDATES,
    wanted_pairs: set[Pair] | None = None,
) -> list[Row]:
    """Rows that together hold every pair of values (or of `wanted_pairs`) but the forbidden ones, and no
    forbidden pair: AETG's greedy (the module's docstring)."""
    rng = random.Random(seed)
    k = len(sizes)
    uncovered = (all_pairs(sizes) if wanted_pairs is None else set(wanted_pairs)) - forbidden
    rows: list[Row] = []
    while uncovered:
        wanted: Counter[tuple[int, int]] = Counter()
        for i, a, j, b in uncovered:
            wanted[i, a] += 1
            wanted[j, b] += 1
        most = max(wanted.values())
        starts = sorted(value for value, n in wanted.items() if n == most)
        best: Row = ()
        best_new = 0
        for _ in range(candidates):
            first, value = rng.choice(starts)
            row = [-1] * k
            row[first] = value
            chosen = [first]
            rest = [i for i in range(k) if i != first]
            rng.shuffle(rest)
            for i in rest:
                gains = []
                for v in range(sizes[i]):
                    held = [_pair(i, v, f, row[f]) for f in chosen]
                    gains.append(-1 if forbidden.intersection(held) else sum(p in uncovered for p in held))
                top = max(gains)
                if top < 0:
                    raise ValueError(f"no value of parameter {i} goes with {row} and the forbidden pairs")
                row[i] = rng.choice([v for v, gain in enumerate(gains) if gain == top])
                chosen.append(i)
            new = len(pairs_of(tuple(row)) & uncovered)
            if new > best_new:
                best, best_new = tuple(row), new
        rows.append(best)
        uncovered -= pairs_of(best)
    return rows


@dataclass(frozen=True)
class PairCell:
    """A value of each parameter, run as one cell: a row of the array, or the own cell of a pair kept apart."""

    values: tuple[matrix.Cell, ...]  # one per parameter, in parameters() order
    defaults: tuple[bool, ...]  # whether each is its parameter's default
    known_failure: str = ""  # a KNOWN_FAILURES cell: the last line of its traceback
    refusal: str = ""  # a PAIR_REFUSALS cell: its line

    @property
    def apart(self) -> bool:
        """A cell of its own for a pair kept out of the array."""
        return bool(self.known_failure or self.refusal)

    @property
    def name(self) -> str:
        """The values that are not defaults, or "defaults"."""
        chosen = [cell.name for cell, default in zip(self.values, self.defaults, strict=True) if not default]
        return " ".join(chosen) or "defaults"

    @property
    def settings(self) -> tuple[tuple[str, Any], ...]:
        return tuple(item for cell in self.values for item in cell.settings)

    @property
    def extras(self) -> frozenset[str]:
        """The EXTRA_CELLS among its values: own_model, own_data, resume."""
        return frozenset(cell.name for cell in self.values) & frozenset(matrix.EXTRA_CELLS)

    def config(self, **base: Any) -> TrainConfig:
        """The TrainConfig of this cell over `base`."""
        return TrainConfig(**{**base, **dict(self.settings)})


def _index(params: Sequence[Parameter], name: str) -> tuple[int, int]:
    """(parameter, value) indices of the value called `name`."""
    return next((i, v) for i, p in enumerate(params) for v, cell in enumerate(p.values) if cell.name == name)


@functools.cache
def pair_cells() -> tuple[PairCell, ...]:
    """The pair matrix's cells: the covering array over parameters(), then a cell per pair kept apart
    (PAIR_REFUSALS, KNOWN_FAILURES)."""
    params = parameters()
    apart = {_pair(*_index(params, a), *_index(params, b)): (line or "", "") for (a, b), line in PAIR_REFUSALS.items()}
    apart |= {_pair(*_index(params, a), *_index(params, b)): ("", line) for (a, b), line in KNOWN_FAILURES.items()}
    sizes = [len(p.values) for p in params]
    # A value that refuses alone under some groups (REFUSED_IN_SOME_GROUPS) stays out of the array, whose
    # cells must run under every group; cells of its own then hold its pairs, refused where it is.
    partial = [_index(params, name) for name in REFUSED_IN_SOME_GROUPS]
    every = all_pairs(sizes)
    with_partial = frozenset(pair for pair in every if {pair[:2], pair[2:]} & set(partial))
    rows = [(row, ("", "")) for row in covering_array(sizes, frozenset(apart) | with_partial)]
    for value in partial:
        others = with_partial - {pair for pair in with_partial if value in (pair[:2], pair[2:])}
        own = {pair for pair in with_partial if value in (pair[:2], pair[2:])}
        rows += [(row, ("", "")) for row in covering_array(sizes, frozenset(apart) | others, wanted_pairs=own)]
    for (i, a, j, b), lines in apart.items():
        row = [0] * len(params)
        row[i], row[j] = a, b
        rows.append((tuple(row), lines))
    return tuple(
        PairCell(
            tuple(p.values[v] for p, v in zip(params, row, strict=True)),
            tuple(v == 0 for v in row),
            known_failure=failure,
            refusal=refusal,
        )  # fmt: skip
        for row, (refusal, failure) in rows
    )


def expect(strategy: matrix.Strategy, precision: str, device: str, processes: int, cell: PairCell) -> matrix.Outcome:
    """What `cell` does under the group: the option matrix's expectations, composed (the module's docstring)."""
    for value, default in zip(cell.values, cell.defaults, strict=True):
        alone = matrix.expect(strategy, precision, device, processes, matrix.Cell("defaults") if default else value)
        if alone.kind == "refuses":
            return alone
    # A DeepSpeed JSON with its own optimizer and schedule builds neither of the config's, so the
    # pairs kept apart (all of them the config's optimizer with its schedule) train there.
    if cell.refusal and not strategy.own_optimizer:
        return matrix.Outcome("refuses", (cell.refusal,))
    if cell.known_failure and not strategy.own_optimizer:
        return matrix.Outcome("crashes", (cell.known_failure,))
    # The option matrix's rules on the whole config. A cell named own_model is read as the own
    # model (no floating-point buffers), whatever model its settings leave in the config.
    name = "own_model" if "own_model" in cell.extras else cell.name
    return matrix.expect(strategy, precision, device, processes, matrix.Cell(name, cell.settings))


def groups(device: str) -> list[tuple[matrix.Strategy, str, int]]:
    """The (strategy, precision, processes) groups the pair cells run in on `device`: on the CPU
    CPU_GROUPS, on a GPU every group of the option matrix."""
    found = matrix.groups(device)
    if device == "cpu":
        found = [g for g in found if (g[0].name, g[1], g[2]) in CPU_GROUPS]
        assert len(found) == len(CPU_GROUPS), "a CPU_GROUPS entry that is no group of matrix.groups('cpu')"
    return found


def counts(device: str) -> list[tuple[str, Counter[str]]]:
    """Per group on `device`: its label and how many cells train, change something, crash (known failures)."""
    return [
        (f"{s.name} {p} {n}p", Counter(expect(s, p, device, n, cell).kind for cell in pair_cells()))
        for s, p, n in groups(device)
    ]


def headline(devices: Sequence[str]) -> str:
    """The pair matrix's size in a few lines (docs/strategies.md holds them): the parameters and
    cells, and per device its groups and what their cells are expected to do."""
    params = parameters()
    cells = pair_cells()
    apart = sum(c.apart for c in cells)
    lines = [
        f"{len(params)} parameters ({', '.join(f'{p.name} {len(p.values)}' for p in params)}) make "
        f"{len(all_pairs([len(p.values) for p in params]))} pairs of values, all held by {len(cells) - apart} "
        f"cells, plus {apart} pair{'s' * (apart != 1)} kept apart in a cell of its own ({len(cells)} a group)."
    ]
    label = {"cpu": "On the CPU", "cuda": "On a CUDA GPU"}
    for device in devices:
        total: Counter[str] = Counter()
        found = counts(device)
        for _, kinds in found:
            total += kinds
        lines.append(
            f"{label[device]}: {len(found)} groups, {sum(total.values())} cells: {total['trains']} train as asked, "
            f"{total['changes']} train with lines saying what changed, {total['refuses']} refuse, "
            f"{total['crashes']} fail as known."
        )
    return "\n\n".join(lines)


def summary(devices: Sequence[str]) -> str:
    """headline(), then a line per group."""
    lines = [headline(devices)]
    for device in devices:
        lines.append(f"{device}:")
        for group, kinds in counts(device):
            lines.append(
                f"  {group}: {sum(kinds.values())} cells, {kinds['trains']} train, {kinds['changes']} with lines, "
                f"{kinds['refuses']} refuse, {kinds['crashes']} known failures"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the pair matrix's sizes: `python -m tests.pairs [--docs] [cpu|cuda]` (default both;
    --docs: the lines docs/strategies.md holds, without the groups)."""
    args = sys.argv[1:] if argv is None else argv
    docs = "--docs" in args
    devices = [a for a in args if a != "--docs"] or ["cpu", "cuda"]
    print(headline(devices) if docs else summary(devices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

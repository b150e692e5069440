"""The GPU tier's runner (tests/gpu_suite.py) on the CPU: which cells the quick suite and the shards
hold, and how cells share a card's memory (stand-in cells, a stand-in card)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import tests.card_watch as card_watch
import tests.gpu_suite as suite
from tests import matrix, pairs
from tests.card_watch import CardWatch
from tests.process_tree import signal_tree, tree


def test_the_quick_suite_and_the_shards_hold_the_whole_tier_once(tmp_path):
    quick, rest = suite.quick(tmp_path), suite.rest(tmp_path)
    shards = [suite.shard(rest, k, 3) for k in (1, 2, 3)]
    assert sorted(c.name for s in shards for c in s) == sorted(c.name for c in rest)  # each once
    names = [c.name for c in quick + rest]
    assert len(names) == len(set(names))
    groups = {f"pairs {s.name} {p}" for s, p, _ in pairs.groups("cuda")}
    groups |= {f"matrix {s.name} {p}" for s, p, _ in matrix.groups("cuda")}
    assert groups <= set(names)  # every pair and option group runs, in the quick suite or a shard
    recipes = sorted((suite.REPO / "recipes").glob("*.yaml"))
    assert sum(n.startswith("recipe ") for n in names) == len(recipes) * len(suite.recipe_strategies())
    files = {p.name for p in (suite.REPO / "tests" / "gpu").glob("test_*.py")} - set(suite.RUN_AS_CELLS)
    run = " ".join(" ".join(c.command) for c in quick + rest)
    assert all(f"tests/gpu/{name}" in run for name in files)
    # A file split into its tests runs each in a cell of its own, but not the test the quick suite runs.
    fsdp = [c.name for c in rest if c.name.startswith("pytest test_fsdp.py::")]
    assert len(fsdp) == len(suite.collected_tests("tests/gpu/test_fsdp.py")) - 1 > 5
    assert not any("test_sigterm_under_fsdp2" in name for name in fsdp)


def test_cells_share_the_card_without_passing_its_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "card_gib", lambda: 20.0)  # 95%: 19 GiB for the cells
    log = tmp_path / "log.txt"

    def cell(name: str, gib: float) -> suite.Cell:
        code = (f"import time; open({str(log)!r}, 'a').write('start {name} {gib}\\n'); time.sleep(0.3); "
                f"open({str(log)!r}, 'a').write('end {name} {gib}\\n')")  # fmt: skip
        return suite.Cell(name, tmp_path / name, [sys.executable, "-c", code], lambda p, o: (p.returncode == 0, ""),
                          gib, 1.0)  # fmt: skip

    cells = [cell("heavy1", 10), cell("heavy2", 10), *(cell(f"small{i}", 3) for i in range(4))]
    rows = suite.run_cells(cells, tmp_path, parallel=3, budget=60, watch=CardWatch())
    assert sorted(r["cell"] for r in rows) == sorted(c.name for c in cells) and all(r["passed"] for r in rows)
    held, most, slots = 0.0, 0.0, 0
    for line in log.read_text().splitlines():
        what, _, gib = line.split()
        held += float(gib) if what == "start" else -float(gib)
        slots += 1 if what == "start" else -1
        most = max(most, held)
        assert slots <= 3
    assert most <= 19.0
    # The small cells did not wait for the second large one: one ran beside the first.
    first_end = log.read_text().splitlines().index(next(x for x in log.read_text().splitlines() if x.startswith("end")))
    assert any(x.startswith("start small") for x in log.read_text().splitlines()[:first_end])


def test_a_cell_past_the_budget_fails_with_a_line(tmp_path):
    slow = suite.Cell("slow", tmp_path / "slow", [sys.executable, "-c", "import time; time.sleep(30)"],
                      lambda p, o: (True, ""), 1.0, 1.0)  # fmt: skip
    late = suite.Cell("late", tmp_path / "late", [sys.executable, "-c", "pass"], lambda p, o: (True, ""), 1.0, 0.5)
    rows = {r["cell"]: r for r in suite.run_cells([slow, late], tmp_path, parallel=1, budget=11, watch=CardWatch())}
    assert not rows["slow"]["passed"] and rows["slow"]["detail"] == "ran past the budget (11 s)"
    assert not rows["late"]["passed"] and rows["late"]["detail"] == "not started: budget spent"
    assert Path(tmp_path / "slow").is_dir()


def test_each_cell_is_charged_the_gpu_memory_of_its_own_processes(monkeypatch):
    # A cell whose launcher starts a worker: the worker's memory is the cell's, another process's is not.
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    launcher = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):  # until the worker exists
            worker = [p for p in tree(launcher.pid) if p != launcher.pid]
            if worker:
                break
            time.sleep(0.05)
        readings = {
            tuple(card_watch.QUERY_APPS): [[worker[0], 1500], [1, 9000]],
            tuple(card_watch.QUERY_CARD): [[10500]],
        }
        monkeypatch.setattr(card_watch, "_numbers", lambda args: readings[tuple(args)])
        watch = CardWatch()
        watch.track("launch", launcher.pid)
        watch.sample()
        readings[tuple(card_watch.QUERY_APPS)] = [[worker[0], 700]]
        watch.sample()
        watch.untrack("launch")
        assert watch.peak_gib("launch") == round(1500 / 1024, 1) and watch.peak_gib("other") is None
        assert watch.card_peak == (10500, ["launch"])
    finally:
        signal_tree(launcher.pid, signal.SIGKILL)
        launcher.wait()

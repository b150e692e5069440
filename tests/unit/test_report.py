"""Training curves, confusion matrix and summary from a run's metrics.jsonl and results.json."""

from __future__ import annotations

import argparse
import json

import pytest
from PIL import Image

from accel_mnist import UsageError

from accel_mnist.report import (  # isort: skip (one line of names, kept by fmt: skip)
    CONFUSION_FILE, CURVES_FILE, plot_confusion_matrix, plot_training_curves, register, summarize, write_report,
)  # fmt: skip

pytest.importorskip("matplotlib")


def _matrix(correct: int, wrong: int) -> list[list[int]]:
    return [[correct if i == j else (wrong if j == (i + 1) % 10 else 0) for j in range(10)] for i in range(10)]


def make_run(path, *, distributed_type="MULTI_CPU", zero_stage=0, num_processes=2, results=True, steps=(50, 100)):
    """A run directory as the loop writes it: metrics.jsonl rows and results.json."""
    path.mkdir(parents=True)
    rows = [
        {"epoch": s / 469, "step": s, "train_loss": 1.0 / s, "test_loss": 2.0 / s, "test_accuracy": 0.8 + s / 1000,
         "test_samples": 10000, "lr": 1e-3, "samples_per_second": 1234.5}
        for s in steps
    ]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if results:
        (path / "results.json").write_text(json.dumps({
            "test_accuracy": rows[-1]["test_accuracy"], "test_loss": rows[-1]["test_loss"],
            "train_loss": rows[-1]["train_loss"], "steps": steps[-1], "train_seconds": 12.34,
            "samples_per_second": 1234.5, "dataset": "mnist", "distributed_type": distributed_type,
            "zero_stage": zero_stage, "num_processes": num_processes, "confusion_matrix": _matrix(900, 100),
        }))  # fmt: skip
    return path


def assert_png(path, min_size=(300, 300)):
    assert path.is_file()
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.verify()
    with Image.open(path) as image:
        assert image.width >= min_size[0] and image.height >= min_size[1], image.size
        # Not a blank canvas: a plot has many distinct colours.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20


def test_write_report_draws_both_pngs(tmp_path):
    run = make_run(tmp_path / "run", distributed_type="DEEPSPEED", zero_stage=2)
    written = write_report(run)
    assert written == [run / CURVES_FILE, run / CONFUSION_FILE]
    assert_png(run / CURVES_FILE, min_size=(1000, 300))
    assert_png(run / CONFUSION_FILE)


def test_write_report_without_results_draws_only_the_curves(tmp_path):
    run = make_run(tmp_path / "running", results=False, steps=(50,))
    assert write_report(run) == [run / CURVES_FILE]
    assert_png(run / CURVES_FILE)


def test_two_runs_side_by_side(tmp_path):
    ddp = make_run(tmp_path / "ddp")
    zero = make_run(tmp_path / "zero2", distributed_type="DEEPSPEED", zero_stage=2, steps=(30, 60, 90))
    out = plot_training_curves([ddp, zero], tmp_path / "out" / "both.png")
    assert out == tmp_path / "out" / "both.png"
    assert_png(out, min_size=(1000, 300))
    text = summarize([ddp, zero])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].split()[:3] == ["run", "strategy", "steps"]
    assert "MULTI_CPU, 2 proc" in lines[2] and "DEEPSPEED ZeRO-2, 2 proc" in lines[3]
    # steps, train_seconds, samples/s, final test accuracy and loss
    assert lines[2].split()[-5:] == ["100", "12.3", "1234", "0.9000", "0.0200"]
    assert lines[3].split()[-5:] == ["90", "12.3", "1234", "0.8900", "0.0222"]


def test_summary_of_an_unfinished_run_uses_its_last_row(tmp_path):
    text = summarize([make_run(tmp_path / "running", results=False)])
    assert "running (no results.json)" in text and text.splitlines()[-1].split()[-5:] == [
        "100",
        "-",
        "1234",
        "0.9000",
        "0.0200",
    ]


def test_confusion_matrix_checks_its_shape(tmp_path):
    assert_png(plot_confusion_matrix(_matrix(5, 1), [str(d) for d in range(10)], tmp_path / "cm.png"))
    with pytest.raises(UsageError, match="does not match 3 classes"):
        plot_confusion_matrix(_matrix(5, 1), ["a", "b", "c"], tmp_path / "bad.png")


def _cli(argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_report_command(tmp_path, capsys, monkeypatch):
    ddp = make_run(tmp_path / "ddp")
    zero = make_run(tmp_path / "zero2", distributed_type="DEEPSPEED", zero_stage=2)
    assert _cli(["report", str(ddp), str(zero), "--output", str(tmp_path / "cmp.png")]) == 0
    out = capsys.readouterr().out
    assert "DEEPSPEED ZeRO-2, 2 proc" in out and f"wrote {tmp_path / 'cmp.png'}" in out
    for path in (
        ddp / CURVES_FILE,
        ddp / CONFUSION_FILE,
        zero / CURVES_FILE,
        zero / CONFUSION_FILE,
        tmp_path / "cmp.png",
    ):
        assert_png(path, min_size=(200, 200))
    # Several runs without --output: the comparison goes to ./comparison.png.
    monkeypatch.chdir(tmp_path)
    assert _cli(["report", str(ddp), str(zero)]) == 0
    assert_png(tmp_path / "comparison.png")


def test_two_runs_of_one_strategy_stay_apart_in_both_tables(tmp_path, capsys):
    """`report a/run b/run`: each table's lines name their run, the strategy beside it."""
    mib = 1 << 20
    states = {"parameter_bytes": 4 * mib, "gradient_bytes": 4 * mib, "optimizer_state_bytes": 8 * mib,
              "offloaded_bytes": 0}  # fmt: skip
    process = {"rank": 0, **states, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
               "peak_rss_bytes": 900 * mib, "alloc_retries": None, "ooms": None}  # fmt: skip
    runs = []
    for seed in ("a", "b"):
        run = make_run(tmp_path / seed / "run", distributed_type="NO", num_processes=1)
        results = json.loads((run / "results.json").read_text())
        memory = {"per_process": [process], "predicted": {**states, "peak_allocated_bytes": None}}
        (run / "results.json").write_text(json.dumps({**results, "memory": memory}))
        runs.append(str(run))
    assert _cli(["report", *runs, "--output", str(tmp_path / "cmp.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("memory per process, MiB (measured / predicted):")
    for table in (lines[:at], lines[at + 1 :]):
        assert table[0].split()[:2] == ["run", "strategy"]
        rows = [line for line in table if line.startswith(str(tmp_path))]
        assert [row.split("  ")[0] for row in rows] == runs, table
        assert all(row[len(runs[0]) :].split()[:3] == ["NO,", "1", "proc"] for row in rows), rows


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "run directory {p} does not exist"),
    (lambda p: p.mkdir(), "{p} has no metrics.jsonl (not a training output directory?)"),
    (lambda p: (p.mkdir(), (p / "metrics.jsonl").write_text("")),
     "{p}/metrics.jsonl has no rows yet (no evaluation has finished)"),
    (lambda p: (p.mkdir(), (p / "metrics.jsonl").write_text('{"step": 1}\n{oops\n')),
     "{p}/metrics.jsonl:2: not a JSON line"),
])  # fmt: skip
def test_report_errors_name_the_directory(tmp_path, setup, message):
    good = make_run(tmp_path / "good")
    bad = tmp_path / "bad"
    setup(bad)
    with pytest.raises(UsageError) as info:
        _cli(["report", str(good), str(bad)])
    assert str(info.value) == message.format(p=bad)
    assert not (good / CURVES_FILE).exists()  # nothing drawn before every directory was checked


def test_through_the_accel_mnist_cli(tmp_path, capsys):
    from accel_mnist.cli import EXIT_USAGE, main

    run = make_run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    assert "MULTI_CPU, 2 proc" in capsys.readouterr().out
    assert_png(run / CURVES_FILE)
    assert_png(run / CONFUSION_FILE)
    assert main(["report", str(tmp_path / "missing")]) == EXIT_USAGE
    assert capsys.readouterr().err == f"error: run directory {tmp_path / 'missing'} does not exist\n"


def test_metrics_files_are_read_with_bounded_memory(tmp_path, monkeypatch):
    # metrics.jsonl may come from someone else's run directory: a line longer than any row of
    # ours stops the read, and the report refuses a file larger than it would hold in memory.
    from accel_mnist import report
    from accel_mnist.run import outputs

    run = make_run(tmp_path / "run")
    metrics = run / "metrics.jsonl"
    rows = metrics.read_text()
    metrics.write_text(rows + '{"step": 99, "pad": "' + "x" * outputs.MAX_METRICS_LINE + '"}\n')
    with pytest.raises(UsageError, match=rf"metrics.jsonl:{rows.count(chr(10)) + 1}: a line longer than"):
        report.load_run(run)
    metrics.write_text(rows)
    monkeypatch.setattr(report, "MAX_METRICS_BYTES", len(rows.encode()) - 1)
    with pytest.raises(UsageError, match=r"metrics.jsonl: larger than .*more rows than a report draws"):
        report.load_run(run)


def test_resume_keeps_the_rows_up_to_its_step_and_stops_at_a_line_not_ours(tmp_path):
    from accel_mnist.run import outputs

    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s}) for s in (10, 20, 30)]
    metrics.write_text("\n".join([*lines, "x" * (outputs.MAX_METRICS_LINE + 1), json.dumps({"step": 5})]) + "\n")
    outputs.truncate_metrics(tmp_path, 20)
    assert metrics.read_text() == "".join(line + "\n" for line in lines[:2])
    outputs.truncate_metrics(tmp_path, None)
    assert metrics.read_text() == ""

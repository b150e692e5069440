"""Model states per process under DDP and ZeRO-1/2/3, fp32, on 1 and 2 CPU processes (gloo).

One launch per strategy and process count, a wide mlp (1.86M parameters): each run's results.json
`memory` holds the tensors counted in every process; they must equal the prediction, halve from
one process to two where the stage partitions them, and `accel-mnist estimate` must print the
same prediction.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import CONFIGS, MNIST_DIR, accelerate_launch, real_mnist_present

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("launch/test_memory.py")]

HIDDEN = "1024,1024"
TRAIN_ARGS = ["--model", "mlp", "--mlp-hidden", HIDDEN, "--batch-size", "32", "--max-steps", "3",
              "--eval-batch-size", "1000", "--data-loader", "device", "--no-download", "--no-export",
              "--no-save-checkpoints", "--no-plots"]  # fmt: skip
STRATEGIES = {"ddp": "multi_cpu.yaml", "zero1": "zero1.yaml", "zero2": "zero2.yaml", "zero3": "zero3.yaml"}
KINDS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "offloaded_bytes")
FIELDS = {"rank", *KINDS, "peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes", "alloc_retries", "ooms"}
# What each stage partitions, and so halves from one process to two.
HALVED = {"zero1": ("optimizer_state_bytes",), "zero2": ("optimizer_state_bytes", "gradient_bytes"),
          "zero3": ("optimizer_state_bytes", "gradient_bytes", "parameter_bytes")}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    out = {}
    for processes in (1, 2):
        for name, config in STRATEGIES.items():
            run_dir = tmp_path_factory.mktemp(f"{name}-{processes}")
            launch = ["--config_file", str(CONFIGS / config), "--num_processes", str(processes),
                      "--mixed_precision", "no", "--main_process_port", "0"]  # fmt: skip
            proc, results = accelerate_launch(launch, TRAIN_ARGS, run_dir)
            assert proc.returncode == 0, f"{name} x{processes} failed:\n{proc.stderr[-4000:]}"
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            out[name, processes] = (results, rows, proc.stdout)
    return out


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_measured_equals_predicted_in_every_process(runs, name, processes):
    results, rows, stdout = runs[name, processes]
    assert results["num_processes"] == processes and results["zero_stage"] == (int(name[-1]) if name != "ddp" else 0)
    memory = results["memory"]
    assert set(memory) == {"per_process", "predicted"}
    assert set(memory["predicted"]) == {*KINDS, "peak_allocated_bytes", "peak_source"}
    assert memory["predicted"]["peak_allocated_bytes"] is None  # on a CPU the peak is the RSS: none predicted
    assert memory["predicted"]["peak_source"] is None
    assert [p["rank"] for p in memory["per_process"]] == list(range(processes))
    for process in memory["per_process"]:
        assert set(process) == FIELDS
        # On a CPU: no accelerator allocator, nothing offloaded, the peak is the process's RSS.
        assert process["peak_allocated_bytes"] is None and process["ooms"] is None and process["offloaded_bytes"] == 0
        assert process["peak_rss_bytes"] > sum(process[k] for k in KINDS)
        for kind in KINDS[:3]:
            assert process[kind] == pytest.approx(memory["predicted"][kind], rel=0.05), (kind, process)
    # The metrics rows carry the largest of each peak of any process, under the same names and
    # meanings (no allocated peak on a CPU); the last line on stdout sums it up.
    assert rows[-1]["peak_allocated_bytes"] is None
    assert rows[-1]["peak_rss_bytes"] == max(p["peak_rss_bytes"] for p in memory["per_process"])
    assert stdout.strip().splitlines()[-1].startswith("model states per process")
    assert "peak_allocated_bytes" not in results  # results.json states the peaks under memory only


@pytest.mark.parametrize("name", list(HALVED))
def test_two_processes_hold_half_of_what_the_stage_partitions(runs, name):
    one = runs[name, 1][0]["memory"]["per_process"][0]
    for process in runs[name, 2][0]["memory"]["per_process"]:
        for kind in KINDS[:3]:
            expected = one[kind] / 2 if kind in HALVED[name] else one[kind]
            assert process[kind] == pytest.approx(expected, rel=0.05), (kind, process, one)


def test_ddp_partitions_nothing(runs):
    one = runs["ddp", 1][0]["memory"]["per_process"][0]
    for process in runs["ddp", 2][0]["memory"]["per_process"]:
        assert {k: process[k] for k in KINDS} == pytest.approx({k: one[k] for k in KINDS}, rel=0.01)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_estimate_prints_the_runs_prediction(runs, name, capsys):
    from accel_mnist.cli import main

    for processes in (1, 2):
        predicted = runs[name, processes][0]["memory"]["predicted"]
        argv = ["estimate", "--model", "mlp", "--mlp-hidden", HIDDEN, "--num-processes", str(processes),
                "--mixed-precision", "no", "--cpu", "--strategy", name, "--json"]  # fmt: skip
        assert main(argv) == 0
        printed = json.loads(capsys.readouterr().out)["per_process"][name]
        assert {k: printed[k] for k in KINDS} == {k: predicted[k] for k in KINDS}

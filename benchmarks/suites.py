"""The benchmark suites, as data: named rows of a command and what to read from its run.

A row is a dict:

  name     unique within the suite; the table's row label
  group    rows of one group are compared with each other (one table per group)
  what     one line for the table: what the row measures
  cmd      argv; placeholders {python} {accel_mnist} {accelerate} {data} {run}
           {recipe} {seed} are filled in by the runner ({run}: a fresh folder per run)
  parse    how the row's numbers are read (runner.PARSERS): "wall" (the command's wall
           seconds only), "json_line" (the last JSON line of stdout), "results"
           ({run}/results.json), "curve" ({run}/metrics.jsonl: the time to `target`)
  repeat   runs of the row; rows of a group are interleaved repeat by repeat, so that
           other load on the machine hits them alike ("seeds": one seed per run instead)
  env      extra environment variables; `needs`: "cuda" skips the row without a GPU,
           "recipe" without --recipe
  budget   seconds the row may take at most (the runner skips it when less is left)

`ratios` name the comparisons the README table states, as (numerator row, denominator
row, statistic[, numerator key, denominator key]): e.g. the 1-step command's median wall time
over the floor's; "pairs" takes the median of run-by-run ratios (report.ratio_lines).
"""

from __future__ import annotations

from typing import Any

# python, `import torch, accelerate`, one torch optimizer: what any such command pays. Building a
# torch optimizer imports torch._dynamo (Optimizer.add_param_group is wrapped in
# torch._disable_dynamo, which imports it on the first call), so that is part of the floor.
FLOOR = "import torch, accelerate; torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])"
ONE_STEP = ["train", "--model", "linear", "--max-steps", "1", "--no-export", "--data-dir", "{data}",
            "--output-dir", "{run}", "--overwrite", "--quiet"]  # fmt: skip

Row = dict[str, Any]

# The seed's setup through accel_mnist (ZeRO-2 fp16 on one GPU, linear b64, Adam 3e-4); rows add the epochs.
# With --prewarm (from h200-2026-12-02k on): a throwaway engine's step loads DeepSpeed's kernels before
# the clock; without it the first step took 0.5-0.7 s.
SEED_ZERO2 = ["{accelerate}", "launch", "--config_file", "accelerate_configs/zero2.yaml", "--num_processes", "1",
              "-m", "accel_mnist", "train", "--model", "linear", "--batch-size", "64", "--lr", "3e-4",
              "--data-dir", "{data}", "--output-dir", "{run}", "--overwrite", "--quiet", "--no-export",
              "--no-save-checkpoints", "--prewarm"]  # fmt: skip
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}

CPU: list[Row] = [
    {"name": "floor", "group": "startup", "what": "python -c 'import torch, accelerate; torch.optim.Adam(...)'",
     "cmd": ["{python}", "-c", FLOOR], "parse": "wall", "repeat": 5},
    {"name": "one_step", "group": "startup", "what": "accel-mnist train --model linear --max-steps 1 --no-export",
     "cmd": ["{accel_mnist}", *ONE_STEP], "parse": "wall", "repeat": 5},
]  # fmt: skip

# One call of at most 10 minutes on one H200: the rows' budgets add up to 430 s, the most
# important first (the runner skips what no longer fits --budget).
SINGLE_GPU = ["{accelerate}", "launch", "--config_file", "accelerate_configs/single_gpu.yaml"]
BF16 = {"ACCELERATE_MIXED_PRECISION": "bf16"}
COMPILED = {**BF16, "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"}
RECIPE_RUN = ["train", "--config", "{recipe}", "--seed", "{seed}", "--data-dir", "{data}", "--output-dir", "{run}",
              "--overwrite", "--quiet"]  # fmt: skip
H200: list[Row] = [
    {"name": "recipe", "group": "time_to_99", "what": "python -m accel_mnist train --config RECIPE (the recipe's "
     "precision: fp32), a fresh process per seed", "needs": "recipe",
     "cmd": ["{python}", "-m", "accel_mnist", *RECIPE_RUN],
     "parse": "curve", "target": 0.99, "seeds": [0, 1, 2, 3, 4], "budget": 80},
    {"name": "recipe_plain", "group": "time_to_99", "what": "plain PyTorch loop on the same recipe (fp32, whole "
     "split on the GPU, the same untimed warm-up step)", "needs": "recipe",
     "cmd": ["{python}", "-m", "benchmarks.baselines.plain_pytorch", "--config", "{recipe}", "--seed", "{seed}",
             "--data", "device", "--precision", "no", "--data-dir", "{data}", "--metrics-out", "{run}/metrics.jsonl",
             "--out", "{run}"],
     "parse": "curve", "target": 0.99, "seeds": [0, 1, 2, 3, 4], "budget": 60},
    {"name": "floor", "group": "startup", "what": "python -c 'import torch, accelerate; torch.optim.Adam(...)'",
     "cmd": ["{python}", "-c", FLOOR], "parse": "wall", "repeat": 3, "budget": 30},
    {"name": "one_step", "group": "startup", "what": "python -m accel_mnist train --model linear --max-steps 1 "
     "--no-export (bf16)", "cmd": ["{python}", "-m", "accel_mnist", *ONE_STEP], "env": BF16, "parse": "wall",
     "repeat": 3, "budget": 40},
    {"name": "recipe_multi_gpu", "group": "time_to_99", "what": "the recipe through multi_gpu.yaml --num_processes 1 "
     "(DDP, bf16)", "needs": "recipe",
     "cmd": ["{accelerate}", "launch", "--config_file", "accelerate_configs/multi_gpu.yaml", "--num_processes", "1",
             "-m", "accel_mnist", *RECIPE_RUN],
     "parse": "curve", "target": 0.99, "seeds": [0], "budget": 30},
    {"name": "recipe_zero2", "group": "time_to_99", "what": "the recipe through zero2.yaml --num_processes 1 "
     "(DeepSpeed ZeRO-2, fp16)", "needs": "recipe",
     "cmd": ["{accelerate}", "launch", "--config_file", "accelerate_configs/zero2.yaml", "--num_processes", "1",
             "-m", "accel_mnist", *RECIPE_RUN],
     "parse": "curve", "target": 0.99, "seeds": [0], "budget": 40},
    {"name": "seed_zero2", "group": "seed_setup", "what": "the seed's setup through accel_mnist: zero2.yaml, 1 GPU, "
     "linear b64, Adam 3e-4, 5 epochs (fp16)",
     "cmd": [*SEED_ZERO2, "--epochs", "5"], "parse": "curve", "target": 0.99, "repeat": 1, "budget": 75},
    {"name": "seed_plain_fp16", "group": "seed_setup", "what": "plain PyTorch, same setup, fp16 autocast + "
     "GradScaler, torch DataLoader", "cmd": ["{python}", "-m", "benchmarks.baselines.plain_pytorch", "--model",
     "linear", "--batch-size", "64", "--lr", "3e-4", "--epochs", "5", "--data", "dataloader", "--precision", "fp16",
     "--data-dir", "{data}", "--metrics-out", "{run}/metrics.jsonl", "--out", "{run}"],
     "parse": "curve", "target": 0.99, "repeat": 1, "budget": 45},
    {"name": "one_step_launch", "group": "startup", "what": "python -m accel_mnist's 1-step command through "
     "accelerate launch --config_file accelerate_configs/single_gpu.yaml",
     "cmd": [*SINGLE_GPU, "-m", "accel_mnist", *ONE_STEP], "parse": "wall", "repeat": 1, "budget": 30},
]  # fmt: skip

# Issue 21's speed suite on one H200, more than one 10-minute call's worth, so it runs by groups
# (benchmarks/results/h200-2026-12-02 names the calls): the seeds of recipes/fast99_graph.yaml in
# one process (as speed records time them; benchmarks/repeat.py), accel_mnist and its plain twin,
# captured and eager, fp32 and bf16; the step's makeup (benchmarks/step_profile.py); fresh
# commands of both in bf16 (the recipe's measured precision), also with cuDNN's autotuning.
GRAPH_RECIPE = "recipes/fast99_graph.yaml"
REPEAT = ["{python}", "-m", "benchmarks.repeat", "--data-dir", "{data}"]
GRAPH_RUN = [*RECIPE_RUN[:2], GRAPH_RECIPE, *RECIPE_RUN[3:]]
PLAIN_GRAPH_BF16 = ["{python}", "-m", "benchmarks.baselines.plain_pytorch", "--config", GRAPH_RECIPE, "--seed",
                    "{seed}", "--data", "device", "--precision", "bf16", "--data-dir", "{data}"]  # fmt: skip
H200_SPEED: list[Row] = [
    {"name": "repeat_graph", "group": "in_process", "what": "accel_mnist, fast99_graph.yaml (captured step, "
     "channels-last, fp32), 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19"], "parse": "json_line", "repeat": 1, "budget": 45},
    {"name": "repeat_graph_plain", "group": "in_process", "what": "the plain twin on fast99_graph.yaml (captured "
     "as torch.cuda.graphs' whole-network example), 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--runner", "plain", "--seeds", "0-19"], "parse": "json_line",
     "repeat": 1, "budget": 35},
    {"name": "repeat_graph_eager", "group": "in_process", "what": "accel_mnist, fast99_graph.yaml with "
     "cuda_graph=false (the same training, eager), 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19", "--set", "cuda_graph=false"],
     "parse": "json_line", "repeat": 1, "budget": 40},
    {"name": "repeat_graph_bf16", "group": "in_process_bf16", "what": "accel_mnist, fast99_graph.yaml in bf16 "
     "autocast (ACCELERATE_MIXED_PRECISION=bf16), 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19"], "env": BF16, "parse": "json_line", "repeat": 1,
     "budget": 35},
    {"name": "repeat_graph_bf16_plain", "group": "in_process_bf16", "what": "the plain twin on fast99_graph.yaml, "
     "captured, bf16 autocast, 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--runner", "plain", "--seeds", "0-19", "--", "--precision", "bf16"],
     "parse": "json_line", "repeat": 1, "budget": 35},
    {"name": "repeat_bf16_plain_eager", "group": "in_process_bf16", "what": "the plain twin on fast99_graph.yaml, "
     "eager, bf16 autocast, 20 seeds in one process", "needs": "recipe",
     "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--runner", "plain", "--seeds", "0-19", "--", "--precision", "bf16",
             "--no-cuda-graph"],
     "parse": "json_line", "repeat": 1, "budget": 45},
    {"name": "step_profile", "group": "step", "what": "one step of bncnn b512, eager/captured x NCHW/channels-last: "
     "ms/step, GPU ms/step, kernels and launch calls per step",
     "cmd": ["{python}", "-m", "benchmarks.step_profile"], "parse": "json_line", "repeat": 1, "budget": 30},
    {"name": "recipe_graph", "group": "time_to_99", "what": "ACCELERATE_MIXED_PRECISION=bf16 python -m accel_mnist "
     "train --config recipes/fast99_graph.yaml, a fresh process per seed", "needs": "recipe",
     "cmd": ["{python}", "-m", "accel_mnist", *GRAPH_RUN], "env": BF16, "parse": "curve", "target": 0.99,
     "seeds": list(range(20)), "budget": 270},
    {"name": "recipe_graph_plain", "group": "time_to_99", "what": "the plain twin on fast99_graph.yaml (captured, "
     "bf16), a fresh process per seed", "needs": "recipe",
     "cmd": [*PLAIN_GRAPH_BF16, "--metrics-out", "{run}/metrics.jsonl", "--out", "{run}"],
     "parse": "curve", "target": 0.99, "seeds": list(range(8)), "budget": 95},
    {"name": "recipe_graph_cudnn", "group": "time_to_99_cudnn", "what": "the recipe_graph commands with "
     "--cudnn-benchmark (0.180 s in one process, h200-2026-12-02h): cuDNN's autotuning in prewarm and capture",
     "needs": "recipe", "cmd": ["{python}", "-m", "accel_mnist", *GRAPH_RUN, "--cudnn-benchmark"], "env": BF16,
     "parse": "curve", "target": 0.99, "seeds": list(range(20)), "budget": 290},
    {"name": "recipe_graph_cudnn_plain", "group": "time_to_99_cudnn", "what": "the plain twin's fresh commands "
     "with --cudnn-benchmark", "needs": "recipe",
     "cmd": [*PLAIN_GRAPH_BF16, "--cudnn-benchmark", "--metrics-out", "{run}/metrics.jsonl", "--out", "{run}"],
     "parse": "curve", "target": 0.99, "seeds": list(range(8)), "budget": 100},
    {"name": "repeat_graph_cudnn_benchmark", "group": "variants2", "what": "accel_mnist, fast99_graph.yaml in "
     "bf16 with cudnn_benchmark=true, 20 seeds in one process (cuDNN's autotuning in the uncounted first run)",
     "needs": "recipe", "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19", "--set", "cudnn_benchmark=true"],
     "env": BF16, "parse": "json_line", "repeat": 1, "budget": 50},
    # Issue 45's compiled step (h100-2026-12-06-compiled): inductor's kernels inside the captured step, with a
    # warm compile cache after the first run; in one process at the recipe's learning rate and at 0.02 (the
    # only fewer-steps lever that held 20 of 20 seeds there), then fresh commands at 0.02 (one group each:
    # about 100 s and 520 s).
    {"name": "repeat_graph_compiled", "group": "compiled", "what": "accel_mnist, fast99_graph.yaml in bf16, "
     "cudnn_benchmark=true, compiled (ACCELERATE_DYNAMO_BACKEND=INDUCTOR), 20 seeds in one process",
     "needs": "recipe", "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19", "--set", "cudnn_benchmark=true"],
     "env": COMPILED, "parse": "json_line", "repeat": 1, "budget": 50},
    {"name": "repeat_graph_compiled_lr2", "group": "compiled", "what": "repeat_graph_compiled with lr=0.02",
     "needs": "recipe", "cmd": [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19", "--set", "cudnn_benchmark=true",
                                "--set", "lr=0.02"],
     "env": COMPILED, "parse": "json_line", "repeat": 1, "budget": 50},
    {"name": "recipe_graph_compiled_lr2", "group": "time_to_99_compiled", "what": "ACCELERATE_DYNAMO_BACKEND="
     "INDUCTOR ACCELERATE_MIXED_PRECISION=bf16 python -m accel_mnist train --config recipes/fast99_graph.yaml "
     "--cudnn-benchmark --lr 0.02, a fresh process per seed (warm compile cache from the first)", "needs": "recipe",
     "cmd": ["{python}", "-m", "accel_mnist", *GRAPH_RUN, "--cudnn-benchmark", "--lr", "0.02"], "env": COMPILED,
     "parse": "curve", "target": 0.99, "seeds": list(range(20)), "budget": 540},
]  # fmt: skip

# Issue 45's fewer steps without compilation: benchmarks/variants.py's models and ema_decay's averaged evaluation
# against the registry's BNCNN, each 20 seeds in one process at the uncompiled floor's settings (lr 0.02, cuDNN's
# search: 0.171 s in h100-2026-12-07-batch), so that each shows its steps and its time.
FLOOR = [*REPEAT, "--config", GRAPH_RECIPE, "--seeds", "0-19", "--set", "cudnn_benchmark=true", "--set", "lr=0.02"]
H200_SPEED += [
    {"name": f"fewer_{name}", "group": "fewer_steps", "what": f"{what}, fast99_graph.yaml in bf16, "
     "cudnn_benchmark=true, 20 seeds in one process", "needs": "recipe", "cmd": [*FLOOR, *extra], "env": BF16,
     "parse": "json_line", "repeat": 1, "budget": 45}
    for name, what, extra in (
        ("bncnn", "the registry's BNCNN (32-64-128 channels), lr 0.02", []),
        ("width16", "BNCNN at 16-32-64 channels, lr 0.02", ["--model", "benchmarks.variants:bncnn_16"]),
        ("width16_lr3", "BNCNN at 16-32-64 channels, lr 0.03", ["--model", "benchmarks.variants:bncnn_16",
                                                                 "--set", "lr=0.03"]),
        ("width24", "BNCNN at 24-48-96 channels, lr 0.02", ["--model", "benchmarks.variants:bncnn_24"]),
        ("ema095", "BNCNN evaluated with a moving average of its weights (ema_decay 0.95), lr 0.02",
         ["--set", "ema_decay=0.95"]),
        ("ema090", "BNCNN evaluated with a moving average of its weights (ema_decay 0.90), lr 0.02",
         ["--set", "ema_decay=0.9"]),
        ("width16_ema095", "BNCNN at 16-32-64 channels, ema_decay 0.95, lr 0.02",
         ["--model", "benchmarks.variants:bncnn_16", "--set", "ema_decay=0.95"]),
        ("ema095_max150", "BNCNN, ema_decay 0.95, onecycle over 150 steps, lr 0.02",
         ["--set", "ema_decay=0.95", "--set", "max_steps=150"]),
        ("ema095_lr3", "BNCNN, ema_decay 0.95, lr 0.03", ["--set", "ema_decay=0.95", "--set", "lr=0.03"]),
        # An evaluation every 5 steps finds the 99% up to 5 steps sooner; evaluations are outside the training
        # clock, so the command pays for them instead (its wall and eval_seconds say how much).
        ("ema095_eval5", "BNCNN, ema_decay 0.95, an evaluation every 5 steps, lr 0.02",
         ["--set", "ema_decay=0.95", "--set", "eval_every=5"]),
        # Pooling before BatchNorm and ReLU: they see a quarter of the elements (the eager step's
        # channels-last BatchNorm is among its costliest kernels); a different model, so its steps count too.
        ("pool_first", "BNCNN with conv, pool, BatchNorm, ReLU blocks, lr 0.02",
         ["--set", "model=bncnn_pool"]),
        ("pool_first_ema095_eval5", "the same, ema_decay 0.95, an evaluation every 5 steps, lr 0.02",
         ["--set", "model=bncnn_pool", "--set", "ema_decay=0.95", "--set", "eval_every=5"]),
    )
]  # fmt: skip

# The memory suites (benchmarks/memory_suite.py reads them): one `accel-mnist train` launch per
# strategy, fp32 on the CPU's 2 cores (2 processes over gloo, and 1), the launch's precision on a GPU.
MEMORY_TRAIN = ["-m", "accel_mnist", "train", "--data-loader", "device", "--no-export", "--no-save-checkpoints",
                "--no-plots", "--data-dir", "{data}", "--output-dir", "{run}", "--overwrite", "--quiet"]  # fmt: skip
MLP = ["--model", "mlp", "--batch-size", "64", "--mlp-hidden"]
CPU_WIDE = [*MLP, "2048,2048,2048", "--max-steps", "20"]
CLIENT_MLP = [*MLP, ",".join(["4096"] * 8), "--max-steps", "30"]  # 121M parameters: a client's model
LINEAR = ["--model", "linear", "--batch-size", "64"]
CPU_ENV = {**NO_GPU, "OMP_NUM_THREADS": "1"}


def _launch(config: str, processes: int, *extra: str) -> list[str]:
    return ["{accelerate}", "launch", "--config_file", f"accelerate_configs/{config}.yaml", "--num_processes",
            str(processes), "--main_process_port", "0", *extra]  # fmt: skip


def _memory_row(name: str, what: str, launch: list[str], model: list[str], **more: Any) -> Row:
    return {"name": name, "group": "memory", "what": what, "cmd": [*launch, *MEMORY_TRAIN, *model],
            "parse": "memory", "repeat": 1, **more}  # fmt: skip


FP32 = ("--mixed_precision", "no")
MEMORY_CPU: list[Row] = [
    _memory_row("floor_2", "the process floor: linear (7850 parameters), DDP, 2 processes",
                _launch("multi_cpu", 2), [*LINEAR, "--max-steps", "20"], env=CPU_ENV),
    *[_memory_row(f"{name}_{n}", f"mlp 2048x3 (10.0M parameters), {label}, fp32, {n} process(es)",
                  _launch(config, n, *FP32), CPU_WIDE, env=CPU_ENV)
      for n in (1, 2)
      for name, config, label in (("ddp", "multi_cpu", "DDP"), ("zero1", "zero1", "ZeRO-1"),
                                  ("zero2", "zero2", "ZeRO-2"), ("zero3", "zero3", "ZeRO-3"))],
    _memory_row("zero2_small_buckets_2", "the same under ZeRO-2 with DeepSpeed's buckets cut to 5e7 elements "
                "(benchmarks/configs/zero2_small_buckets.json)",
                _launch("zero_file", 2, "--deepspeed_config_file", "benchmarks/configs/zero2_small_buckets.json"),
                CPU_WIDE, env=CPU_ENV),
]  # fmt: skip
MEMORY_H200: list[Row] = [
    _memory_row("floor", "linear (7850 parameters), single_gpu.yaml (bf16): data and CUDA context alone",
                _launch("single_gpu", 1), [*LINEAR, "--max-steps", "30"], budget=45),
    *[_memory_row(name, f"the client's mlp 4096x8 (121M parameters), batch 64, 30 steps, {config}.yaml, 1 GPU",
                  _launch(config, 1), CLIENT_MLP, budget=budget)
      for name, config, budget in (("single_gpu", "single_gpu", 50), ("ddp", "multi_gpu", 50), ("zero1", "zero1", 60),
                                   ("zero2", "zero2", 60), ("zero3", "zero3", 60),
                                   ("zero3_offload", "zero3_offload", 90))],
    _memory_row("recipe_1b", "recipes/zero3_offload_1b.yaml: mlp 16384x5 (1.09B parameters) under "
                "zero3_offload.yaml, 1 GPU", _launch("zero3_offload", 1),
                ["--config", "recipes/zero3_offload_1b.yaml"], budget=150),
]  # fmt: skip
MEMORY_H200X2: list[Row] = [
    _memory_row(f"{name}_2", f"the client's mlp 4096x8, {config}.yaml, 2 GPUs", _launch(config, 2), CLIENT_MLP,
                needs="cuda2", budget=90)
    for name, config in (("ddp", "multi_gpu"), ("zero1", "zero1"), ("zero2", "zero2"), ("zero3", "zero3"))
]  # fmt: skip

# Scaling from 1 to N processes: DDP and ZeRO-2, weak scaling (the batch per process stays, so N
# processes train N times the samples a step), read as samples per second past each process's
# first step (results.json; the clock pauses for evaluation). Two workloads: the fast recipe's
# model and batch (bncnn, 512 a process) and a large batch (4096 a process), a fixed number of
# steps each. A row of N processes needs N GPUs ("cudaN"): on a machine of two, the rows of four
# and eight are skipped with that reason. The CPU suite runs the same rows at 1 and 2 processes
# of one thread each, to keep the suite working where no multi-GPU machine is lent.
SCALE_TRAIN = ["-m", "accel_mnist", "train", "--config", "recipes/fast99.yaml", "--stop-at-accuracy", "none",
               "--epochs", "1000", "--eval-every", "0", "--data-dir", "{data}", "--output-dir", "{run}",
               "--overwrite", "--quiet", "--no-export", "--no-save-checkpoints"]  # fmt: skip
SCALE_STRATEGIES = (("ddp", "DDP"), ("zero2", "ZeRO-2"))


def _scaling_rows(ddp_config: str, counts: tuple[int, ...], precision: str, workloads: dict[str, list[str]],
                  budget: float, on_gpus: bool) -> list[Row]:  # fmt: skip
    rows = []
    for strategy, label in SCALE_STRATEGIES:
        config = ddp_config if strategy == "ddp" else "zero2"
        for workload, args in workloads.items():
            rows += [{"name": f"{strategy}_{workload}_{n}", "group": f"scaling_{strategy}_{workload}",
                      "what": f"{label}, --mixed_precision {precision}, {' '.join(args)}, {n} process(es)",
                      "cmd": [*_launch(config, n, "--mixed_precision", precision), *SCALE_TRAIN, *args],
                      "parse": "results", "processes": n, "repeat": 2, "budget": budget,
                      **({"needs": f"cuda{n}"} if on_gpus else {"env": CPU_ENV})}
                     for n in counts]  # fmt: skip
    return rows


def _scaling_ratios(rows: list[Row]) -> list[tuple[str, ...]]:
    """Each row of N > 1 processes against its group's row of one."""
    ones = {row["group"]: row["name"] for row in rows if row["processes"] == 1}
    key = "steady_samples_per_second"
    return [(row["name"], ones[row["group"]], "scaling", key, key) for row in rows if row["processes"] > 1]


SCALING_H200 = _scaling_rows("multi_gpu", (1, 2, 4, 8), "bf16",
                             {"recipe": ["--max-steps", "175"], "large": ["--batch-size", "4096", "--max-steps", "60"]},
                             budget=70, on_gpus=True)  # fmt: skip
SCALING_CPU = _scaling_rows("multi_cpu", (1, 2), "no",
                            {"recipe": ["--max-steps", "8"], "large": ["--batch-size", "2048", "--max-steps", "4"]},
                            budget=240, on_gpus=False)  # fmt: skip

SUITES: dict[str, dict[str, Any]] = {
    "cpu": {"rows": CPU, "ratios": [("one_step", "floor", "median"), ("one_step", "floor", "min")], "plot": None},
    "h200": {
        "rows": H200,
        "needs": "cuda",
        "ratios": [("one_step", "floor", "median"), ("one_step_launch", "floor", "median")],
        # test accuracy against training seconds, one curve per run
        "plot": ["recipe", "recipe_plain", "recipe_multi_gpu", "recipe_zero2", "seed_zero2", "seed_plain_fp16"],
    },
    "h200_speed": {"rows": H200_SPEED, "needs": "cuda", "plot": ["recipe_graph", "recipe_graph_plain"]},
    "scaling_h200": {"rows": SCALING_H200, "needs": "cuda", "ratios": _scaling_ratios(SCALING_H200), "plot": None},
    "scaling_cpu": {"rows": SCALING_CPU, "ratios": _scaling_ratios(SCALING_CPU), "plot": None},
    "memory_cpu": {"rows": MEMORY_CPU, "plot": None},
    "memory_h200": {"rows": MEMORY_H200, "needs": "cuda", "plot": None},
    "memory_h200x2": {"rows": MEMORY_H200X2, "needs": "cuda", "plot": None},
}

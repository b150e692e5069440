"""The option matrix: every training option that changes how the step or the model runs, under
every strategy a launch can ask for and each precision that strategy takes.

Nothing here is listed by hand cell by cell. The options are the TrainConfig fields whose
metadata holds `cells` (config.py), plus three ways of running that are not fields (your own
model, your own data, a resume). The strategies are the shipped accelerate configs (each YAML
in accelerate_configs/, read as `accelerate launch` reads it), DeepSpeed JSONs named by
`--deepspeed_config` with and without an optimizer of their own, and torch.compile through
dynamo. Each cell's expected outcome comes from the rules the runtime applies (option_rules.py
and the launch checks): it trains as asked, trains with one line saying what was changed, or
stops before any output with one `error:` line. tests/launch/test_matrix.py and
tests/gpu/test_matrix.py run the cells and compare; `python -m tests.matrix`
prints the table docs/strategies.md holds.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, fields
from typing import Any

from accel_mnist.config import TrainConfig
from accel_mnist.distributed.option_rules import (
    averaging_refusal,
    buffers_change,
    capture_refusal,
    channels_last_change,
    eager_line,
    float_buffers,
)
from accel_mnist.distributed.strategy import Strategy as RunStrategy
from accel_mnist.distributed.strategy_checks import FSDP_NEEDS_A_DEVICE, fp16_on_cpu
from accel_mnist.optim import optimizer_class_name

# Ways of running that are not TrainConfig fields: train(config, model=...), train(config,
# train_data=..., test_data=...), and a run stopped after its first step and resumed.
EXTRA_CELLS = ("own_model", "own_data", "resume")
PRECISIONS = ("no", "bf16", "fp16")
# dynamo's backend per device: inductor compiles C++ for the CPU for minutes on 2 cores; "eager"
# runs dynamo's tracing and graph breaks (what decides whether a model compiles) without codegen.
DYNAMO_BACKEND = {"cpu": "eager", "cuda": "inductor"}


@dataclass(frozen=True)
class Cell:
    """One option's value (with the settings it needs), or one of EXTRA_CELLS."""

    name: str
    settings: tuple[tuple[str, Any], ...] = ()

    def config(self, **base: Any) -> TrainConfig:
        """The TrainConfig of this cell over `base`."""
        return TrainConfig(**{**base, **dict(self.settings)})


def option_cells() -> list[Cell]:
    """The defaults, then every `cells` value of every TrainConfig field, then EXTRA_CELLS."""
    cells = [Cell("defaults")]
    for f in fields(TrainConfig):
        for value in f.metadata.get("cells", ()):
            settings = value if isinstance(value, dict) else {f.name: value}
            label = ",".join(f"{k}={v}" for k, v in settings.items())
            cells.append(Cell(label, tuple(settings.items())))
    return cells + [Cell(name) for name in EXTRA_CELLS]


@dataclass(frozen=True)
class Strategy:
    """A strategy as a launch asks for it: the accelerate config (or JSON) and what it sets up."""

    name: str
    kind: str  # Accelerate's DistributedType name
    launch: tuple[str, ...]  # the `accelerate launch` arguments, or ("python",) plus train's own flags
    train_args: tuple[str, ...] = ()
    zero_stage: int = 0
    fsdp_version: int = 0
    dynamo: bool = False  # torch.compile through dynamo, launched with --dynamo_backend (DYNAMO_BACKEND)
    own_optimizer: bool = False  # a DeepSpeed JSON with its own optimizer section
    cpu_only: bool = False  # use_cpu: the config trains on the CPU even beside a GPU
    gpu_only: bool = False  # FSDP, or a config that names its GPUs (gpu_ids)

    def runs_on(self, device: str) -> bool:
        """Whether this strategy is one that runs on `device` ("cpu" or "cuda") at all."""
        return not (device == "cpu" and self.gpu_only) and not (device == "cuda" and self.cpu_only)


def _yaml_strategy(name: str, path: str, raw: dict[str, Any], jsons: dict[str, Any]) -> Strategy:
    kind = str(raw.get("distributed_type", "NO"))
    launch: tuple[str, ...] = ("--config_file", path)
    if int(raw.get("num_machines", 1)) > 1:
        launch += ("--num_machines", "1")  # a multi-machine config, run on one machine
    cpu_only = bool(raw.get("use_cpu", False))
    gpu_only = not cpu_only and (kind == "FSDP" or "gpu_ids" in raw)
    if kind == "DEEPSPEED":
        ds = raw.get("deepspeed_config", {})
        json_path = ds.get("deepspeed_config_file")
        stage, own = _json_shape(jsons[json_path]) if json_path else (int(ds.get("zero_stage", 0)), False)
        return Strategy(name, kind, launch, zero_stage=stage, own_optimizer=own, gpu_only=gpu_only)
    version = int(raw.get("fsdp_config", {}).get("fsdp_version", 1)) if kind == "FSDP" else 0
    return Strategy(name, kind, launch, fsdp_version=version, cpu_only=cpu_only, gpu_only=gpu_only)


def _json_shape(data: dict[str, Any]) -> tuple[int, bool]:
    """A DeepSpeed JSON's ZeRO stage, and whether it brings its own optimizer."""
    return int(data.get("zero_optimization", {}).get("stage", 0)), "optimizer" in data


def strategies() -> list[Strategy]:
    """Every shipped accelerate config, the DeepSpeed JSONs through --deepspeed_config, and dynamo."""
    from pathlib import Path

    import yaml

    from accel_mnist.files import read_json_object
    from accel_mnist.shipped import shipped

    files = {key: file for key, file in shipped().items() if key.startswith("accelerate_configs/")}
    jsons = {key: read_json_object(Path(str(file))) for key, file in files.items() if key.endswith(".json")}
    found = [
        _yaml_strategy(_stem(key), key, yaml.safe_load(file.read_text()), jsons)
        for key, file in files.items()
        if key not in jsons
    ]
    for key, data in jsons.items():  # --deepspeed_config under a plain `python -m accel_mnist`
        stage, own = _json_shape(data)
        found.append(Strategy(f"--deepspeed_config {_stem(key)}", "DEEPSPEED", ("python",),
                              ("--deepspeed_config", key), zero_stage=stage, own_optimizer=own))  # fmt: skip
    found.append(Strategy("dynamo", "NO", (), dynamo=True))
    return found


def _stem(key: str) -> str:
    """ "zero2" for "accelerate_configs/zero2.yaml"."""
    return key.split("/", 1)[1].rsplit(".", 1)[0]


def precisions(strategy: Strategy) -> tuple[str, ...]:
    """The precisions a strategy's launch can ask for: a --deepspeed_config JSON alone sets its own."""
    return ("no",) if strategy.launch == ("python",) else PRECISIONS


def groups(device: str) -> list[tuple[Strategy, str, int]]:
    """The (strategy, precision, processes) launches the tests run on `device`, each over every cell.

    On a GPU machine of one GPU: every strategy that runs there, at each precision, one process.
    On the CPU (the launch tier, 2 cores): every strategy at fp32 with one process; bf16 and fp16
    for the first strategy of each kind (fp16 is refused alike by every CPU launch); and two
    processes for the first strategy of each kind, ZeRO stage and own optimizer, where two
    processes change what runs (DDP, ZeRO's partitions).
    """
    found = [s for s in strategies() if s.runs_on(device)]
    if device != "cpu":
        return [(s, p, 1) for s in found for p in precisions(s)]
    out: list[tuple[Strategy, str, int]] = []
    kinds: set[str] = set()
    sharded: set[tuple[str, int, bool]] = set()
    for s in found:
        ddp = s.cpu_only and s.kind == "MULTI_GPU"  # multi_cpu.yaml: DDP only with two processes
        out.append((s, "no", 2 if ddp else 1))
        if s.kind not in kinds and s.launch != ("python",) and not s.dynamo:
            kinds.add(s.kind)
            out += [(s, "bf16", 2 if ddp else 1), (s, "fp16", 2 if ddp else 1)]
        shape = (s.kind, s.zero_stage, s.own_optimizer)
        if s.kind == "DEEPSPEED" and shape not in sharded:
            sharded.add(shape)
            out.append((s, "no", 2))
    return out


def launch_args(strategy: Strategy, device: str, precision: str | None, processes: int) -> list[str]:
    """`accelerate launch` arguments for a cell group (the --deepspeed_config strategies: []);
    `precision` None leaves the config's own."""
    if strategy.launch == ("python",):
        return []
    launch = list(strategy.launch)
    if strategy.dynamo:  # the one-process config of the device, compiled
        yaml = "cpu.yaml" if device == "cpu" else "single_gpu.yaml"
        launch = ["--config_file", f"accelerate_configs/{yaml}", "--dynamo_backend", DYNAMO_BACKEND[device]]
    return [*launch, "--num_processes", str(processes), *(["--mixed_precision", precision] if precision else [])]


def launch_kind(strategy: Strategy, processes: int) -> str:
    """The DistributedType name Accelerate sets up for `strategy` at `processes` processes."""
    if strategy.kind == "MULTI_GPU" and strategy.cpu_only:
        return "MULTI_CPU" if processes > 1 else "NO"
    return strategy.kind


@dataclass(frozen=True)
class Outcome:
    """What a cell does: "trains", "changes" (with the lines it prints) or "refuses" (its error line)."""

    kind: str
    lines: tuple[str, ...] = ()


def expect(strategy: Strategy, precision: str, device: str, processes: int, cell: Cell) -> Outcome:
    """The outcome of `cell` under `strategy` at `precision` on `device` with `processes` processes."""
    if precision == "fp16" and device == "cpu":
        return Outcome("refuses", (fp16_on_cpu(None),))
    if strategy.kind == "FSDP" and device == "cpu":
        return Outcome("refuses", (FSDP_NEEDS_A_DEVICE,))
    config = cell.config()
    kind = launch_kind(strategy, processes)
    grad_accum = config.grad_accum or 1
    setup = RunStrategy(kind=kind, device=device, precision=precision, grad_accum=grad_accum,
                  dynamo=DYNAMO_BACKEND[device] if strategy.dynamo else "no", zero_stage=strategy.zero_stage,
                  fsdp_version=strategy.fsdp_version, scaler=precision == "fp16" and kind != "DEEPSPEED")  # fmt: skip
    if config.ema_decay is not None and (why := averaging_refusal(setup)):
        return Outcome("refuses", (why,))
    lines = []
    if config.channels_last and (line := channels_last_change(setup)):
        lines.append(line)
    if line := buffers_change(setup, _float_buffers(cell)):
        lines.append(line)
    if config.cuda_graph:
        optimizer = "DeepSpeed's own" if strategy.own_optimizer else optimizer_class_name(config)
        if (reason := capture_refusal(setup, config, optimizer)) is not None:
            lines.append(eager_line(reason))
    return Outcome("changes", tuple(lines)) if lines else Outcome("trains")


def _float_buffers(cell: Cell) -> bool:
    """Whether the cell's model holds floating-point buffers (the registry's models, built on the CPU)."""
    if cell.name in EXTRA_CELLS:
        return False  # the own model has none; the others train the default model
    config = cell.config()
    return _model_has_float_buffers(config.model, config.mlp_hidden)


@functools.cache
def _model_has_float_buffers(name: str, mlp_hidden: str | None) -> bool:
    # Once a model: a table asks it for every strategy and precision.
    from accel_mnist.models import build_model

    return float_buffers(build_model(name, mlp_hidden))


def counts(device: str) -> dict[str, int]:
    """How many cells of the whole matrix on `device` train, change something, or refuse (one process)."""
    found = {"cells": 0, "trains": 0, "changes": 0, "refuses": 0}
    for s in strategies():
        if s.runs_on(device):
            for p in precisions(s):
                for cell in option_cells():
                    found["cells"] += 1
                    found[expect(s, p, device, 1, cell).kind] += 1
    return found


def markdown(device: str) -> str:
    """The matrix on `device` as Markdown: a row per strategy and precision, what its cells do."""
    label = {"cpu": "a CPU-only machine", "cuda": "a CUDA GPU"}[device]
    total = counts(device)
    lines = [
        f"On {label}: {total['cells']} cells ({len(option_cells())} options under each strategy and precision): "
        f"{total['trains']} train as asked, {total['changes']} train with one line saying what changed, "
        f"{total['refuses']} stop with one `error:` line.",
        "",
        "| strategy | precision | trains | changes (the line) | refuses (the line) |",
        "|---|---|---|---|---|",
    ]
    for s in strategies():
        if not s.runs_on(device):
            continue
        for p in precisions(s):
            outcomes = [(cell, expect(s, p, device, 1, cell)) for cell in option_cells()]
            trains = sum(o.kind == "trains" for _, o in outcomes)
            changed = "<br>".join(f"`{c.name}`: {o.lines[0]}" for c, o in outcomes if o.kind == "changes")
            refused = {o.lines[0] for _, o in outcomes if o.kind == "refuses"}
            refuses = f"all {len(outcomes)}: {refused.pop()}" if len(refused) == 1 else ""
            lines.append(f"| {s.name} | {p} | {trains} | {changed} | {refuses} |")
    return "\n".join(lines)


def tables(devices: list[str]) -> str:
    """The tables docs/strategies.md holds, one per device."""
    return "\n\n".join(markdown(d) for d in devices)


def main(argv: list[str] | None = None) -> int:
    """Print the tables: `python -m tests.matrix [cpu|cuda]` (default both)."""
    args = sys.argv[1:] if argv is None else argv
    print(tables(args or ["cpu", "cuda"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

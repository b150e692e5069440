"""The strategy a launch set up, described once: a frozen `Strategy` value.

It is worked out once from the live Accelerator (`Strategy.of`), written into results.json and
each checkpoint's trainer_state.json (`fields`), and read back from them (`from_fields`). Code
outside this room asks it questions (how a throwaway copy of the model computes, whether the
strategy steps a DeepSpeed engine of its own, whether a checkpoint resumes here, what to call it)
instead of branching on the distributed type itself; tests/unit/test_house.py reads the code and
holds that line. The option rules (option_rules.py) and the option matrix (tests/matrix.py) take
the same value, written down for a cell.

Pure Python at import: `accel-mnist estimate` and `report` read it without torch's start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..caller import setting
from ..errors import UsageError
from ..precision import is_sixteen_bit

# Strategies in which every process holds the whole model and optimizer (DistributedType is a str
# enum, so its members compare equal to these names).
REPLICATED = ("NO", "MULTI_CPU", "MULTI_GPU")


@dataclass(frozen=True)
class CopyPrecision:
    """How a throwaway copy of the model (prewarm's, the memory probe's) computes as the prepared model does."""

    weights: str | None  # "fp16"/"bf16": the copy's weights and buffers take it; None: they stay as they are
    autocast: bool  # its forward runs under the Accelerator's autocast (a no-op where the Accelerator has none)


AS_PREPARED_ELSEWHERE = CopyPrecision(None, autocast=True)  # one process and DDP: fp32 weights under autocast


@dataclass(frozen=True)
class Strategy:
    """What the accelerate config resolved to: DistributedType name, device, precision and the rest."""

    kind: str = "NO"  # DistributedType's value: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP, ...
    device: str = "cpu"
    precision: str = "no"  # Accelerate's mixed_precision: no, fp16, bf16, fp8
    num_processes: int = 1
    grad_accum: int = 1
    dynamo: str = "no"  # dynamo's backend, lower case
    dynamo_mode: str = "default"  # torch.compile's mode (ACCELERATE_DYNAMO_MODE); only where dynamo is on
    zero_stage: int = 0  # DeepSpeed only
    offload_optimizer: str = "none"  # DeepSpeed only: none, cpu or nvme
    offload_param: str = "none"
    fsdp_version: int = 0  # FSDP only
    fsdp_state_dict_type: str = ""
    fsdp_offload_params: bool = False
    fsdp_use_orig_params: bool = True
    scaler: bool = False  # a torch grad scaler: fp16 outside DeepSpeed

    @classmethod
    def of(cls, accelerator: Any) -> Strategy:
        """The Strategy of a live Accelerator (public attributes only)."""
        state = accelerator.state
        kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
        extra: dict[str, Any] = {}
        plugin = getattr(state, "deepspeed_plugin", None)
        if plugin is not None and kind == "DEEPSPEED":
            zero = plugin.deepspeed_config.get("zero_optimization", {})
            extra.update(
                zero_stage=int(plugin.zero_stage),
                offload_optimizer=str(zero.get("offload_optimizer", {}).get("device", "none")),
                offload_param=str(zero.get("offload_param", {}).get("device", "none")),
            )
        fsdp = getattr(state, "fsdp_plugin", None)
        if fsdp is not None and kind == "FSDP":
            extra.update(
                fsdp_version=int(fsdp.fsdp_version),
                fsdp_state_dict_type=str(getattr(fsdp.state_dict_type, "name", fsdp.state_dict_type)),
                fsdp_offload_params=_offloads(fsdp.cpu_offload),
                fsdp_use_orig_params=bool(fsdp.use_orig_params) if fsdp.fsdp_version == 1 else True,
            )
        return cls(
            kind=kind,
            device=accelerator.device.type,
            precision=str(accelerator.mixed_precision),
            num_processes=int(accelerator.num_processes),
            grad_accum=int(accelerator.gradient_accumulation_steps),
            dynamo=str(state.dynamo_plugin.backend.value).lower(),
            dynamo_mode=str(getattr(state.dynamo_plugin, "mode", None) or "default"),
            scaler=accelerator.scaler is not None,
            **extra,
        )

    def fields(self) -> dict[str, Any]:
        """What results.json and trainer_state.json keep of it (DeepSpeed and FSDP keys only under those)."""
        out: dict[str, Any] = {
            "distributed_type": self.kind,
            "num_processes": self.num_processes,
            "zero_stage": self.zero_stage,
            "mixed_precision": self.precision,
            "device": self.device,
        }
        if self.kind == "DEEPSPEED":
            out.update(offload_optimizer=self.offload_optimizer, offload_param=self.offload_param)
        out["dynamo_backend"] = self.dynamo
        if self.dynamo != "no":
            out["dynamo_mode"] = self.dynamo_mode
        if self.kind == "FSDP":
            out.update(
                fsdp_version=self.fsdp_version,
                fsdp_state_dict_type=self.fsdp_state_dict_type,
                fsdp_offload_params=self.fsdp_offload_params,
            )
            if self.fsdp_version == 1:
                out["fsdp_use_orig_params"] = self.fsdp_use_orig_params
        return out

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Strategy:
        """The Strategy that `fields()` wrote (results.json, a checkpoint's state); missing keys take defaults."""
        names = {
            "distributed_type": "kind", "mixed_precision": "precision", "dynamo_backend": "dynamo",
            "dynamo_mode": "dynamo_mode",
            "num_processes": "num_processes", "zero_stage": "zero_stage", "device": "device",
            "offload_optimizer": "offload_optimizer", "offload_param": "offload_param",
            "fsdp_version": "fsdp_version", "fsdp_state_dict_type": "fsdp_state_dict_type",
            "fsdp_offload_params": "fsdp_offload_params", "fsdp_use_orig_params": "fsdp_use_orig_params",
        }  # fmt: skip
        return cls(**{attr: fields[key] for key, attr in names.items() if fields.get(key) is not None})

    @classmethod
    def recorded_in(cls, results: dict[str, Any]) -> Strategy | None:
        """The Strategy a results.json (or any `fields()` dict) records; None where it records none."""
        return cls.from_fields(results) if "distributed_type" in results else None

    @property
    def replicated(self) -> bool:
        """Every process holds the whole model and optimizer (one process, DDP)."""
        return self.kind in REPLICATED

    @property
    def runs_engine(self) -> bool:
        """The step runs inside an engine of the strategy's own (DeepSpeed), with kernels of its own."""
        return self.kind == "DEEPSPEED"

    @property
    def flattens(self) -> str | None:
        """The name of a strategy that flattens, shards or broadcasts parameters as contiguous memory."""
        if self.kind == "DEEPSPEED":
            return f"DeepSpeed ZeRO-{self.zero_stage}"
        if self.kind == "FSDP":
            return f"FSDP{self.fsdp_version}"
        return None

    @property
    def copy_precision(self) -> CopyPrecision:
        """How a throwaway copy of the model computes as this strategy's prepared model does (Accelerate 1.15).

        DeepSpeed casts the weights to 16 bits and runs no autocast. FSDP computes with 16-bit copies
        of its fp32 weights: FSDP1's forward is wrapped in autocast by `prepare_model`, FSDP2's is not
        (`_prepare_fsdp2` never calls it), and FSDP2 keeps the buffers in 16 bits too (option_rules.
        buffers_change). Elsewhere fp32 weights under autocast. A copy computed otherwise runs other
        kernels (prewarm then loads the wrong ones), keeps other activations (GroupNorm's fp32 outputs
        under autocast doubled the probe's prediction for FSDP2), or fails where dtypes meet
        ("Expected running_mean to have type Float but got BFloat16": an fp32 copy beside FSDP2's
        16-bit BatchNorm buffers).
        """
        sixteen = self.precision if is_sixteen_bit(self.precision) else None
        if self.kind == "DEEPSPEED":
            return CopyPrecision(sixteen, autocast=False)
        if self.kind == "FSDP":
            return CopyPrecision(sixteen, autocast=self.fsdp_version != 2)
        return AS_PREPARED_ELSEWHERE

    @property
    def line(self) -> str:
        """The first line of a run: strategy, precision, world size, device."""
        if self.kind == "DEEPSPEED":
            name = f"DeepSpeed ZeRO-{self.zero_stage}"
            offload = [f"{what} to {where}" for where, what in ((self.offload_optimizer, "optimizer states"),
                       (self.offload_param, "parameters")) if where != "none"]  # fmt: skip
            name += f" (offload {', '.join(offload)})" if offload else ""
        elif self.kind == "FSDP":
            name = f"FSDP{self.fsdp_version}"
        elif self.kind.startswith("MULTI_"):
            name = f"DDP ({self.kind})"
        else:
            name = "one process, no distribution" if self.kind == "NO" else self.kind
        if self.dynamo != "no":
            mode = "" if self.dynamo_mode == "default" else f", mode {self.dynamo_mode}"
            name += f", torch.compile ({self.dynamo}{mode})"
        precision = "fp32" if self.precision == "no" else self.precision
        return f"strategy: {name}; precision: {precision}; world size: {self.num_processes}; device: {self.device}"

    @property
    def label(self) -> str:
        """'DEEPSPEED ZeRO-2, 2 proc': a legend's name for a run."""
        stage = f" ZeRO-{self.zero_stage}" if self.zero_stage else ""
        return f"{self.kind}{stage}, {self.num_processes} proc"

    def loads_universal(self, saved: Strategy) -> bool:
        """Whether a checkpoint saved under `saved` holds ZeRO shards of another number of processes
        than this run has: DeepSpeed then loads it in its universal format (run/universal.py), which
        its engine must be configured for before it is built (`checkpoint.load_universal`)."""
        return self.kind == "DEEPSPEED" and saved.num_processes != self.num_processes

    def check_resume(self, saved: Strategy, path: Path, was: dict[str, Any], now: dict[str, Any]) -> None:
        """Refuse a checkpoint saved under `saved` (with config `was`) that this strategy (with config
        `now`) cannot continue exactly.

        Another number of processes is fine where the global batch stays: DDP and one process hold
        replicated weights and take consecutive batches, and ZeRO shards are converted by DeepSpeed
        (run/universal.py). FSDP's are refused, as is FSDP1 with offloaded parameters.
        """
        # Its checkpoints differ by ZeRO stage, layout, FSDP version and state dict type.
        was_fields, now_fields = saved.fields(), self.fields()
        for key in ("zero_stage", "distributed_type", "fsdp_version", "fsdp_state_dict_type"):
            before, after = was_fields.get(key), now_fields.get(key)
            same = before == after or (key == "distributed_type" and saved.replicated and self.replicated)
            if not same:
                raise UsageError(
                    f"{path} was saved with {key}={before} but this run has {key}={after}; "
                    "resume with the accelerate config it was saved with"
                )
        _check_global_batch(saved.num_processes, self.num_processes, path, was, now)
        if saved.num_processes != self.num_processes and self.kind == "FSDP":
            raise UsageError(
                f"{path} holds FSDP state of {saved.num_processes} processes but this run has {self.num_processes}; "
                f"resume with --num_processes {saved.num_processes}"
            )
        if self.fsdp_version == 1 and self.fsdp_offload_params:
            # FULL and SHARDED state dicts alike drift from the uninterrupted run here; FSDP2 with offload
            # and FSDP1 without it resume exactly (measured: docs/measurements.md#distributedstrategypy).
            raise UsageError(
                f"{path}: resuming FSDP1 with fsdp_offload_params true is not exact (the weights drift from the "
                "uninterrupted run); its weights still export (accel-mnist export), and FSDP2 offload resumes exactly"
            )


def _check_global_batch(n_was: int, n_now: int, path: Path, was: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse a resume that changes the global batch (per-process batch x accumulation x processes)."""
    accum = now.get("grad_accum", 1)
    global_was = was.get("batch_size", 0) * was.get("grad_accum", 1) * n_was
    global_now = now.get("batch_size", 0) * accum * n_now
    if global_was == global_now:
        return
    per_process, rest = divmod(global_was, accum * n_now)
    keep = (f"pass {setting('batch_size', per_process)} to keep it" if per_process and not rest
            else f"{n_now} processes cannot keep it; use a number that divides {global_was // accum}")  # fmt: skip
    raise UsageError(
        f"{path} was saved with a global batch of {global_was} (batch_size {was.get('batch_size')} x "
        f"grad_accum {was.get('grad_accum', 1)} x {n_was} processes) but this run has {global_now}; "
        f"with {n_now} processes {keep}"
    )


def _offloads(policy: Any) -> bool:
    # FSDP1 keeps a CPUOffload(offload_params=...), FSDP2 a CPUOffloadPolicy or a plain OffloadPolicy.
    if hasattr(policy, "offload_params"):
        return bool(policy.offload_params)
    from torch.distributed.fsdp import CPUOffloadPolicy

    return isinstance(policy, CPUOffloadPolicy)

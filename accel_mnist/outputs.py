"""What a run writes: the resolved config, metrics.jsonl and results.json (main process only)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from .config import TrainConfig
from .errors import UsageError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_output_dir(config: TrainConfig, resuming: bool) -> None:
    """Refuse to start afresh over an earlier run's results or checkpoints (nothing saved is lost).

    Called on every rank, so that all of them stop rather than some waiting forever.
    """
    from .checkpoint import list_checkpoints

    out = Path(config.output_dir)
    earlier = list_checkpoints(out)
    if resuming or config.overwrite or not ((out / RESULTS_FILE).exists() or earlier):
        return
    what = f"a finished run ({RESULTS_FILE})" if (out / RESULTS_FILE).exists() else f"checkpoints ({earlier[-1].name})"
    raise UsageError(
        f"{out} already holds {what}; pass --resume-from latest to continue it, "
        "--overwrite to replace it, or choose another --output-dir"
    )


class RunOutputs:
    """The output directory of one run; every write happens on the main process alone."""

    def __init__(self, accelerator: Accelerator, config: TrainConfig, resume_step: int | None = None) -> None:
        """Prepare the directory; `resume_step` keeps the metrics rows up to that step."""
        from .checkpoint import checkpoint_dir, list_checkpoints

        self.accelerator = accelerator
        self.dir = Path(config.output_dir)
        results = self.dir / RESULTS_FILE
        earlier = list_checkpoints(self.dir)
        check_output_dir(config, resuming=resume_step is not None)
        try:  # on every rank (exist_ok), so that a failure stops them all alike
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create output directory {self.dir}: {e.strerror}") from None
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if resume_step is None:  # --overwrite: the earlier run's checkpoints go too
                shutil.rmtree(checkpoint_dir(self.dir), ignore_errors=True)
            else:  # checkpoints after the resume point belong to a future that is rewritten
                for later in earlier:
                    if int(later.name.split("_")[1]) > resume_step:
                        shutil.rmtree(later, ignore_errors=True)
            write_json_atomic(self.dir / CONFIG_FILE, config.to_dict())
            self._truncate_metrics(resume_step)
            results.unlink(missing_ok=True)
        accelerator.wait_for_everyone()

    def _truncate_metrics(self, resume_step: int | None) -> None:
        # Rows logged after the checkpoint by the run that died are logged again on resume.
        path = self.dir / METRICS_FILE
        keep = []
        if resume_step is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= resume_step:
                        keep.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    break  # a line cut short by the crash, and nothing valid after it
        path.write_text("".join(keep))

    def log_metrics(self, row: dict[str, Any]) -> None:
        """Append one evaluation's metrics as a JSON line."""
        if self.accelerator.is_main_process:
            with open(self.dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")

    def write_results(self, results: dict[str, Any]) -> None:
        """Write results.json atomically (main process)."""
        if self.accelerator.is_main_process:
            write_json_atomic(self.dir / RESULTS_FILE, results)

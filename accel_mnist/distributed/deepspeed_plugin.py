"""The DeepSpeedPlugin of a launch's JSON, once a process: Accelerate keeps one DeepSpeed plugin
in its shared AcceleratorState and refuses a second, so a later train() in the same process (a
sweep, a notebook, the option matrix's cells) reuses the first and gets its "auto" values anew.
"""

from __future__ import annotations

import copy
from typing import Any

from accelerate import Accelerator

from ..errors import UsageError
from ..launch.settings import LaunchSettings, zero3_init

# The DeepSpeed JSON the first Accelerator of this process was built with: Accelerate keeps one
# DeepSpeed plugin a process (AcceleratorState is shared) and refuses a second.
_PROCESS_JSON: dict[str, Any] = {}


def process_deepspeed_plugin(launch: LaunchSettings) -> Any:
    """The DeepSpeedPlugin of a --deepspeed_config JSON (None where Accelerate builds its own from
    the accelerate config, or there is no DeepSpeed): the JSON's ZeRO stage, offload, precision
    and accumulation, its "auto" values filled as from a YAML's deepspeed_config_file.

    A later run in the same process (train() called again) gets None, and Accelerate keeps the
    first run's plugin: `fresh_json_values` then gives that plugin the JSON's "auto" values again."""
    found = launch.deepspeed_json
    if found is None:
        return None
    from accelerate.state import is_initialized

    if is_initialized() and _PROCESS_JSON:
        if found.data != _PROCESS_JSON["data"]:
            raise UsageError(
                f"{found.label}: this process already trained under DeepSpeed config {_PROCESS_JSON['label']}, "
                "and Accelerate keeps one DeepSpeed config a process; start a fresh process for another"
            )
        _PROCESS_JSON["later"] = True
        return None
    _PROCESS_JSON.update(data=copy.deepcopy(found.data), label=found.label, later=False)
    if not found.own:
        return None
    from accelerate.utils import DeepSpeedPlugin

    return DeepSpeedPlugin(hf_ds_config=copy.deepcopy(found.data), zero3_init_flag=zero3_init(found))


def fresh_json_values(accelerator: Accelerator) -> None:
    """For a run after the first in this process: the JSON's "auto" values of its optimizer and
    scheduler sections "auto" again, which the last run's prepare filled in place (its learning
    rate, its schedule's length). Batch sizes, accumulation and clipping are set by every run."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or not _PROCESS_JSON.get("later"):
        return
    for section in ("optimizer", "scheduler"):
        written = _PROCESS_JSON["data"].get(section, {}).get("params", {})
        params = plugin.deepspeed_config.get(section, {}).get("params", {})
        params.update({key: "auto" for key, value in written.items() if value == "auto"})

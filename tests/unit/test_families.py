"""benchmarks/families.py's models and the family suite's rows (benchmarks/family_suite.py); nothing is launched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from accel_mnist.cli import build_parser, config_from_args
from accel_mnist.model_output import logits_of
from benchmarks import family_suite
from benchmarks.families import FAMILIES, LAYER_CLASSES
from benchmarks.peak_suite import TRAIN


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_gives_logits_in_training_and_evaluation(name):
    torch.manual_seed(0)
    model = FAMILIES[name]()
    x = torch.randn(2, 1, 28, 28)
    logits = logits_of(model(x))
    assert logits.shape == (2, 10)
    logits.logsumexp(1).sum().backward()
    assert all(p.grad is not None for p in model.parameters()), name  # ZeRO and FSDP rows train every weight
    with torch.no_grad():
        assert logits_of(model.eval()(x)).shape == (2, 10)
    if name in LAYER_CLASSES:  # TRANSFORMER_BASED_WRAP finds the class by name, or the launch fails
        assert LAYER_CLASSES[name] in {type(m).__name__ for m in model.modules()}


def test_the_suite_rows_are_unique_and_hold_out_a_fixed_subset(tmp_path):
    rows = family_suite.rows(tmp_path)
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)) == 164
    held = [r for r in rows if r["held_out"]]
    assert 0 < len(held) < len(rows)
    assert all(r["held_out"] == (r["family"] in ("lstm", "vit", "grouped") or r["batch"] == 4096) for r in rows)
    assert {r["family"] for r in rows if not r["held_out"]} == {"gru", "encoder", "dwconv", "embed", "branchy"}
    assert {r["strategy"] for r in rows} == {*family_suite.STRATEGIES, *family_suite.VARIANTS}
    for r in rows:  # every row's flags parse as `accel-mnist train` parses them
        config = config_from_args(build_parser().parse_args(["train", *r["train"][4:], *r["flags"]]))
        assert config.batch_size == r["batch"] and r["train"][:4] == [*family_suite.WORKER, "--family", r["family"]]
        assert r["train"][4:] == TRAIN[3:]


def test_the_fsdp_variants_are_the_wizard_keys_written_beside_the_records(tmp_path):
    rows = [r for r in family_suite.rows(tmp_path) if "config" in r]
    family_suite.write_configs(rows)
    for r in rows:
        fsdp = yaml.safe_load(Path(r["config"]).read_text())["fsdp_config"]
        assert fsdp["fsdp_version"] == 2 and r["config"].startswith(str(tmp_path))
        policy = {"fsdp2_size": "SIZE_BASED_WRAP", "fsdp2_layer": "TRANSFORMER_BASED_WRAP"}.get(r["strategy"])
        assert fsdp["fsdp_auto_wrap_policy"] == policy or r["strategy"] == "fsdp2_ckpt"
        assert fsdp["fsdp_activation_checkpointing"] == (r["strategy"] == "fsdp2_ckpt")
        if fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP":
            assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == LAYER_CLASSES[r["family"]]
        else:
            assert fsdp["fsdp_min_num_params"] == 100000
    assert not [r for r in rows if r["strategy"] == "fsdp2_layer" and r["family"] in ("gru", "lstm")]


def test_the_capped_cases_and_the_alloc_conf_reach_every_process():
    cases = family_suite.capped_rows("expandable_segments:False")
    assert len(cases) >= 9 and len({c["family"] for c in cases}) >= 3 and len({c["strategy"] for c in cases}) >= 3
    assert all(1.5 <= c["cap_gib"] <= 4 for c in cases)
    for c in cases:
        assert c["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
        assert c["train"][4:6] == ["--cap-gib", str(c["cap_gib"])] and c["flags"][-2:] == ["--batch-size", "auto"]


def test_the_table_reports_ratios_and_what_could_not_be_predicted():
    def record(name, held_out, measured, predicted, **more):
        process = {"peak_allocated_bytes": measured, "peak_reserved_bytes": measured}
        memory = {"per_process": [process], "predicted": {"peak_allocated_bytes": predicted, **more}}
        return family_suite.flatten({"name": name, "held_out": held_out, "rc": 0, "memory": memory})

    records = [record("a", False, 105 << 20, 100 << 20, peak_source="probe"),
               record("b", False, 130 << 20, 100 << 20, peak_source="trace"),
               record("c", True, 100 << 20, None, peak_unpredicted="cannot predict: its forward needs real values"),
               {"name": "d", "held_out": True, "rc": 3, "tail": "x\nerror: out of CUDA memory: ..."}]  # fmt: skip
    text = family_suite.table(records)
    assert "| a |  | 100 (probe) | – | 105 | 105 | 1.050 |  |" in text
    assert "cannot predict: its forward needs real values" in text and "rc 3: error: out of CUDA memory" in text
    assert "**tuning**: 2 rows, 2 predicted, 1 within 10%, 1 under-predicted by more than 10%" in text
    assert "1 not predicted, 1 failed or skipped; worst: –" in text

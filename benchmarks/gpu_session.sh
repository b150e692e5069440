#!/usr/bin/env bash
# One GPU session (2 GPUs) that checks every strategy end to end and records the numbers the
# issues ask for. Run from the repo root on a machine with 2 GPUs:
#     bash benchmarks/gpu_session.sh OUTDIR
# OUTDIR gets runs.tgz (every run's metrics.jsonl/results.json/logs) and summary.json.
# 1-GPU runs go two at a time, one per GPU; 2-GPU runs one at a time.
set -u
OUT=${1:?usage: gpu_session.sh OUTDIR}
R=${RUNS_DIR:-/tmp/accel_mnist_runs}
rm -rf "$R" && mkdir -p "$R" "$OUT"
START=$(date +%s)
TRAIN=(-m accel_mnist train --quiet --no-download)
CNN=(--model cnn --batch-size 512 --epochs 1 --eval-every 20 --no-save-checkpoints --no-export)

source "$(dirname "$0")/session_lib.sh"  # run, gpu0, gpu1, launch

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$R/gpus.txt"

# 1. The seed's configuration (linear, batch 64, Adam 3e-4, fp16, ZeRO-2, 5 epochs) through
#    accel_mnist on 1 GPU, beside the seed script (minimally fixed) and a plain PyTorch loop.
gpu0 run seed_config_zero2_1gpu launch zero2 --num_processes 1 "${TRAIN[@]}" --model linear --batch-size 64 \
  --lr 3e-4 --epochs 5 --no-save-checkpoints --no-export --output-dir "$R/seed_config_zero2_1gpu" &
( gpu1 run seed_script_1gpu torchrun --nproc_per_node 1 -m benchmarks.baselines.seed_fixed --epochs 1 --out "$R/seed_script_1gpu"
  gpu1 run plain_device_linear python3 -m benchmarks.baselines.plain_pytorch --model linear --batch-size 64 --lr 3e-4 \
    --data device --precision fp16 --epochs 1 --out "$R/plain_device_linear"
  gpu1 run plain_dataloader_linear python3 -m benchmarks.baselines.plain_pytorch --model linear --batch-size 64 --lr 3e-4 \
    --data dataloader --precision fp16 --epochs 1 --out "$R/plain_dataloader_linear" ) &
wait

# 2. cnn, batch 512 per GPU, one epoch: multi_gpu (DDP, bf16) and zero2 (fp16) on 1 and 2 GPUs.
gpu0 run multi_gpu_1gpu launch multi_gpu --num_processes 1 "${TRAIN[@]}" "${CNN[@]}" --output-dir "$R/multi_gpu_1gpu" &
gpu1 run zero2_1gpu launch zero2 --num_processes 1 "${TRAIN[@]}" "${CNN[@]}" --output-dir "$R/zero2_1gpu" &
wait
run multi_gpu_2gpu launch multi_gpu --num_processes 2 "${TRAIN[@]}" "${CNN[@]}" --output-dir "$R/multi_gpu_2gpu"
run zero2_2gpu launch zero2 --num_processes 2 "${TRAIN[@]}" "${CNN[@]}" --output-dir "$R/zero2_2gpu"

# 3. ZeRO-3 on 2 GPUs: stop at step 60 (checkpoint at 50 and 60), resume to the end of epoch 2,
#    export; then evaluate the exported model on the CPU.
Z3=(--model cnn --batch-size 512 --epochs 2 --eval-every 20 --checkpoint-every 50 --output-dir "$R/zero3_2gpu")
run zero3_2gpu_part1 launch zero3 --num_processes 2 "${TRAIN[@]}" "${Z3[@]}" --max-steps 60
run zero3_2gpu_resume launch zero3 --num_processes 2 "${TRAIN[@]}" "${Z3[@]}" --resume-from latest
run zero3_export_cpu_eval env CUDA_VISIBLE_DEVICES= python3 -m accel_mnist evaluate --model-path "$R/zero3_2gpu"

# 4. Time to 99.0% test accuracy on 1 GPU, stopping there (two schedules, one per GPU); the
#    wall time is the whole command, launch to results.json.
TTA=(--model cnn --batch-size 512 --eval-every 10 --stop-at-accuracy 0.99 --no-save-checkpoints --no-export)
gpu0 run tta_adam launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --output-dir "$R/tta_adam" &
gpu1 run tta_onecycle launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 3 --scheduler onecycle --lr 4e-3 \
  --output-dir "$R/tta_onecycle" &
wait

# 5. Per-GPU peak memory by ZeRO stage for a >= 1B-parameter MLP, while time remains.
LEFT=$(( ${SESSION_SECONDS:-540} - ($(date +%s) - START) ))
echo "memory benchmark: ${LEFT}s left"
if [ "$LEFT" -gt 60 ]; then
  run memory timeout $((LEFT - 20)) python3 -m benchmarks.memory --launch ddp,zero3,zero2,zero1 --gpus 2 --out "$R/memory"
fi

tar czf "$OUT/runs.tgz" -C "$R" --exclude='checkpoints' --exclude='*.safetensors' --exclude='*.pt' .
python3 - "$R" "$OUT/summary.json" <<'EOF'
import json, pathlib, sys
root, out = pathlib.Path(sys.argv[1]), sys.argv[2]
summary = {}
for wall in sorted(root.glob("*.wall.json")):
    name = wall.name[: -len(".wall.json")]
    entry = json.loads(wall.read_text())
    res = root / name / "results.json"
    if res.exists():
        r = json.loads(res.read_text())
        entry.update({k: r.get(k) for k in ("test_accuracy", "test_loss", "train_seconds", "samples_per_second",
                                             "steps", "epochs", "num_processes", "zero_stage", "mixed_precision",
                                             "distributed_type", "data_loader")})
        entry["in_process_wall_seconds"] = r.get("wall_seconds")
        rows = [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines()]
        hit = next((row for row in rows if row["test_accuracy"] >= 0.99), None)
        entry["first_99"] = hit and {k: hit[k] for k in ("step", "test_accuracy")}
    summary[name] = entry
json.dump(summary, open(out, "w"), indent=1)
print(json.dumps(summary, indent=1))
EOF

#!/usr/bin/env bash
# The performance follow-up to gpu_session.sh, on a machine with 2 GPUs, in three parts that
# each fit a 10-minute call. From the repo root:
#     bash benchmarks/gpu_perf_session.sh 1 OUTDIR   # start-up, time to 99%, scaling at batch 512
#     bash benchmarks/gpu_perf_session.sh 2 OUTDIR   # memory by stage, DeepSpeed step costs on 2 GPUs
#     bash benchmarks/gpu_perf_session.sh 3 OUTDIR   # scaling at batch 2048, throughput of other configs
#     bash benchmarks/gpu_perf_session.sh 4 OUTDIR   # the time-to-99% recipe alone, seed config, fused Adam memory
# OUTDIR gets part<N>.tgz (logs, metrics.jsonl, results.json, benchmark JSON/markdown).
set -u
PART=${1:?usage: gpu_perf_session.sh 1|2|3|4 OUTDIR}
OUT=${2:?usage: gpu_perf_session.sh 1|2|3|4 OUTDIR}
R=${RUNS_DIR:-/tmp/accel_mnist_perf}/part$PART
B=$R/bench  # benchmark scripts' JSON + markdown
rm -rf "$R" && mkdir -p "$R" "$B" "$OUT"
TRAIN=(-m accel_mnist train --quiet --no-download --no-save-checkpoints --no-export)

source "$(dirname "$0")/session_lib.sh"  # run, gpu0, gpu1, launch
scaling() {  # scaling BATCH: multi_gpu and zero2, 1 GPU (both at once, one per GPU) and 2 GPUs
  local SC=(--model cnn --batch-size "$1" --epochs 3)
  gpu0 run "scale_multi_gpu_1gpu_b$1" launch multi_gpu --num_processes 1 "${TRAIN[@]}" "${SC[@]}" --output-dir "$R/scale_multi_gpu_1gpu_b$1" &
  gpu1 run "scale_zero2_1gpu_b$1" launch zero2 --num_processes 1 "${TRAIN[@]}" "${SC[@]}" --output-dir "$R/scale_zero2_1gpu_b$1" &
  wait
  run "scale_multi_gpu_2gpu_b$1" launch multi_gpu --num_processes 2 "${TRAIN[@]}" "${SC[@]}" --output-dir "$R/scale_multi_gpu_2gpu_b$1"
  run "scale_zero2_2gpu_b$1" launch zero2 --num_processes 2 "${TRAIN[@]}" "${SC[@]}" --output-dir "$R/scale_zero2_2gpu_b$1"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$R/gpus.txt"
python3 -c "import torch, accelerate, deepspeed, sys; print(sys.version.split()[0], torch.__version__, accelerate.__version__, deepspeed.__version__)" >"$R/versions.txt" 2>&1

if [ "$PART" = 1 ]; then
  # 1. Start-up: what a run pays before its first step (GPU 0), beside DeepSpeed step costs (GPU 1).
  ( gpu1 run zso_linear python3 -m benchmarks.zero_step_overhead --model linear --batch-size 64 --steps 600 \
      --repeats 2 --out "$B" ) &
  S=(--model linear --max-steps 1 --eval-batch-size 10000)
  gpu0 run import_torch python3 -c "import torch"
  gpu0 run import_torch_cuda python3 -c "import torch; torch.zeros(1, device='cuda')"
  gpu0 run import_deepspeed python3 -c "import deepspeed"
  gpu0 run import_cli python3 -c "import accel_mnist.cli"
  gpu0 run launch_help launch single_gpu -m accel_mnist --help
  gpu0 run direct_1step env ACCELERATE_MIXED_PRECISION=bf16 python3 "${TRAIN[@]}" "${S[@]}" --output-dir "$R/direct_1step"
  gpu0 run launch_1step launch single_gpu "${TRAIN[@]}" "${S[@]}" --output-dir "$R/launch_1step"
  gpu0 run launch_1step_zero2 launch zero2 --num_processes 1 "${TRAIN[@]}" "${S[@]}" --output-dir "$R/launch_1step_zero2"
  gpu0 python3 -X importtime "${TRAIN[@]}" "${S[@]}" --output-dir "$R/importtime_run" 2>"$R/importtime_single_gpu.txt" >/dev/null
  wait

  # 2. Time to 99.0% on one GPU: schedules two at a time, then the cuDNN autotuner, the plain
  #    loop with and without it, and the whole command without the launcher.
  TTA=(--model cnn --batch-size 512 --eval-every 10 --stop-at-accuracy 0.99)
  gpu0 run tta_oc3e3_e6 launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 6 --scheduler onecycle --lr 3e-3 --output-dir "$R/tta_oc3e3_e6" &
  gpu1 run tta_oc4e3_e4 launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --scheduler onecycle --lr 4e-3 --output-dir "$R/tta_oc4e3_e4" &
  wait
  gpu0 run tta_oc3e3_e4 launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --scheduler onecycle --lr 3e-3 --output-dir "$R/tta_oc3e3_e4" &
  gpu1 run tta_oc3e3_e6_cudnn launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 6 --scheduler onecycle --lr 3e-3 --cudnn-benchmark --output-dir "$R/tta_oc3e3_e6_cudnn" &
  wait
  gpu0 run tta_oc4e3_e4_cudnn launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --scheduler onecycle --lr 4e-3 --cudnn-benchmark --output-dir "$R/tta_oc4e3_e4_cudnn" &
  gpu1 run tta_oc5e3_e4_b1024 launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --scheduler onecycle --lr 5e-3 --batch-size 1024 --cudnn-benchmark --output-dir "$R/tta_oc5e3_e4_b1024" &
  wait
  P=(python3 -m benchmarks.baselines.plain_pytorch --model cnn --batch-size 512 --data device --precision bf16 --epochs 2 --out "$B")
  gpu0 run plain_cnn "${P[@]}" &
  gpu1 run plain_cnn_cudnn "${P[@]}" --cudnn-benchmark --tag cudnn &
  wait
  gpu0 run tta_direct_oc3e3_e6 env ACCELERATE_MIXED_PRECISION=bf16 python3 "${TRAIN[@]}" "${TTA[@]}" --epochs 6 --scheduler onecycle --lr 3e-3 --cudnn-benchmark --output-dir "$R/tta_direct_oc3e3_e6" &
  gpu1 run tta_direct_oc4e3_e4 env ACCELERATE_MIXED_PRECISION=bf16 python3 "${TRAIN[@]}" "${TTA[@]}" --epochs 4 --scheduler onecycle --lr 4e-3 --cudnn-benchmark --output-dir "$R/tta_direct_oc4e3_e4" &
  wait

  # 3. 2-GPU scaling at batch 512 per GPU over 3 epochs (evaluation at epoch ends only; the
  #    steady state comes from the epoch-end rows of metrics.jsonl).
  scaling 512
elif [ "$PART" = 2 ]; then
  # 4. Per-GPU peak memory by ZeRO stage (1.275B-parameter MLP), shipped settings and candidates.
  run memory timeout 360 python3 -m benchmarks.memory --gpus 2 --out "$B" \
    --launch ddp,zero1,zero2,zero3,ddp_bucket_view,zero2_small_buckets,zero3_small_buckets
  # 5. DeepSpeed's step costs on 2 GPUs (cnn, batch 512 per GPU), one engine setting at a time.
  run zso_cnn_2gpu timeout 150 torchrun --nproc_per_node 2 -m benchmarks.zero_step_overhead --model cnn \
    --batch-size 512 --steps 200 --repeats 2 --variants plain_amp,zero1,zero2,zero2_no_contiguous,zero2_overlap,zero2_bf16 \
    --out "$B"
elif [ "$PART" = 4 ]; then
  # 7. The time-to-99% recipe found in part 1, alone on the machine: twice without the
  #    launcher, once through it; the seed's configuration through accel_mnist (2 epochs);
  #    peak memory with fused Adam.
  TTA=(--model cnn --batch-size 512 --eval-every 10 --stop-at-accuracy 0.99 --epochs 4 --scheduler onecycle --lr 3e-3)
  gpu0 run tta_direct_1 env ACCELERATE_MIXED_PRECISION=bf16 python3 "${TRAIN[@]}" "${TTA[@]}" --output-dir "$R/tta_direct_1"
  gpu0 run tta_direct_2 env ACCELERATE_MIXED_PRECISION=bf16 python3 "${TRAIN[@]}" "${TTA[@]}" --output-dir "$R/tta_direct_2"
  gpu0 run tta_launch launch single_gpu "${TRAIN[@]}" "${TTA[@]}" --output-dir "$R/tta_launch"
  gpu0 run seed_config_zero2 launch zero2 --num_processes 1 "${TRAIN[@]}" --model linear --batch-size 64 --lr 3e-4 \
    --epochs 2 --output-dir "$R/seed_config_zero2"
  run memory timeout 200 python3 -m benchmarks.memory --gpus 2 --out "$B" \
    --launch ddp_fused_adam,zero2_fused_adam,zero3_fused_adam,ddp_bucket_view_fused_adam
else
  export TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed 0.19.8 cannot parse the "9.0a" it would detect (JIT builds)
  # 6. Scaling at batch 2048 per GPU, and the throughput of the shipped configs not measured
  #    before (cnn b512, 1 epoch).
  scaling 2048
  run throughput timeout 300 python3 -m benchmarks.throughput --configs zero1,zero3,zero2_offload,zero3_offload \
    --gpus 1,2 --model cnn --batch-size 512 --epochs 1 --data-loader device --out "$B"
fi
tar czf "$OUT/part$PART.tgz" -C "$R" --exclude='checkpoints' --exclude='*.safetensors' --exclude='*.pt' .
ls -la "$OUT"

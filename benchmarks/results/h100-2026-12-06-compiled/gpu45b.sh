# Issue 45 on one GPU: `bash gpu45b.sh PHASE...` from the project root on the device machine (carrying .device);
# everything it measures goes to $OUT. Phases: prof, smoke, repeat, fresh, suite.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
R=recipes/fast99_graph.yaml
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, accelerate, deepspeed, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__)" > $OUT/versions.txt 2>&1
cat $OUT/gpu.txt $OUT/versions.txt
# The compile cache of this machine (inductor's FX graph and Triton caches): cold for the first compiled command.
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
t() { date +%s.%N; }
summary() { python3 - "$@" <<'PY'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/results.json"))
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
hit = next((row["train_seconds"] for row in rows if row["test_accuracy"] >= 0.99), None)
p = r.get("profile") or {}
print(json.dumps({"tag": sys.argv[2], "step": r.get("step"), "eager_reason": r.get("eager_reason"), "dynamo": r.get("dynamo_backend"),
  "kind": r.get("distributed_type"), "precision": r.get("mixed_precision"), "steps": r.get("step_count", rows[-1]["step"]),
  "to99_s": hit, "final": rows[-1]["test_accuracy"], "capture_s": r.get("capture_seconds"), "prewarm_s": r.get("prewarm_seconds"),
  "kernels_per_step": p.get("kernels_per_step"), "device_us_per_step": p.get("device_us_per_step"), "us_per_step": p.get("us_per_step"),
  "interrupted": p.get("interrupted")}))
PY
}
# One command; its wall time, its summary line, its results.json copied.
cmd() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-120} "$@" > $OUT/$tag.log 2>&1; local rc=$?; local e=$(t)
  echo "{\"tag\": \"$tag\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($e-$s,2))")}" | tee -a $OUT/walls.jsonl
  [ -f /tmp/o_$tag/results.json ] && cp /tmp/o_$tag/results.json $OUT/results_$tag.json && summary /tmp/o_$tag $tag | tee -a $OUT/summary.jsonl; }
train() { local tag=$1; shift; cmd $tag python3 -m accel_mnist train --config $R --output-dir /tmp/o_$tag --overwrite "$@"; }
launch() { local tag=$1 cfg=$2; shift 2; cmd $tag accelerate launch --config_file accelerate_configs/$cfg --num_processes 1 \
  --main_process_port 0 -m accel_mnist train --config $R --output-dir /tmp/o_$tag --overwrite "$@"; }
rep() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-150} python3 -m benchmarks.repeat --config $R --seeds 0-19 "$@" > $OUT/repeat_$tag.log 2>&1
  echo "$tag rc=$? wall=$(python3 -c "print(round($(t)-$s,1))")"; tail -1 $OUT/repeat_$tag.log | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$tag', r['share_reached'], r['mean_seconds'] and round(r['mean_seconds'],4), round(r['stdev_seconds'],4), r['min_seconds'], r['max_seconds'], sorted(s['steps'] for s in r['seeds']), {s['step'] for s in r['seeds']})" 2>&1 | tee -a $OUT/repeats.txt; }
P="--max-steps 40 --profile 8 --no-export"
for phase in "$@"; do case $phase in
prof)  # --profile under each strategy on one GPU: the recipe's first 40 steps, 8 recorded between evaluations
  train graph $P --cudnn-benchmark
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR LIMIT=300 train compiled_cold $P --cudnn-benchmark
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR train compiled_warm $P --cudnn-benchmark
  train eager $P --cudnn-benchmark --no-cuda-graph
  launch zero2 zero2.yaml $P
  launch fsdp2 fsdp2.yaml $P ;;
smoke)  # the compiled, captured recipe whole, cold cache gone by now
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR train compiled_recipe --cudnn-benchmark --no-export ;;
repeat)  # 20 seeds in one process each
  rep base --set cudnn_benchmark=true
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR rep compiled --set cudnn_benchmark=true
  for v in ${VARIANTS:-"label_smoothing=0.1" "max_steps=150" "max_steps=125" "lr=0.02"}; do
    args=(); for kv in $v; do args+=(--set $kv); done
    ACCELERATE_DYNAMO_BACKEND=${DYN:-NO} rep "${DYN:-eager}_${v//[ =.]/_}" --set cudnn_benchmark=true "${args[@]}"; done ;;
fresh)  # fresh commands over 20 seeds, compiled (warm cache) and not, alternating
  for s in $(seq 0 19); do train fresh_base_$s --seed $s --cudnn-benchmark --no-export $FRESH
    ACCELERATE_DYNAMO_BACKEND=INDUCTOR train fresh_compiled_$s --seed $s --cudnn-benchmark --no-export $FRESH; done ;;
repeat2)  # the compiled step, 20 seeds in one process, dynamo reset before each (benchmarks/repeat.py)
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR rep compiled2 --set cudnn_benchmark=true
  ACCELERATE_DYNAMO_BACKEND=INDUCTOR rep compiled2_lr0_02 --set cudnn_benchmark=true --set lr=0.02 ;;
gputest)  # the captured step's GPU tests, the compiled one among them
  s=$(t); timeout ${PYTEST_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_graph.py ${PYTEST_K:+-k "$PYTEST_K"} -s > $OUT/pytest_cuda_graph.log 2>&1
  echo "pytest rc=$? wall=$(python3 -c "print(round($(t)-$s,1))")"; tail -3 $OUT/pytest_cuda_graph.log ;;
freshc)  # fresh compiled commands (warm compile cache), seed after seed until DEADLINE (epoch seconds)
  for s in $(seq 0 19); do [ $(date +%s) -lt ${DEADLINE:-0} ] || break
    ACCELERATE_DYNAMO_BACKEND=INDUCTOR train fresh_compiled_$s --seed $s --cudnn-benchmark --no-export $FRESH; done ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
suite) make test-gpu GPU_OUT=/tmp/q > $OUT/suite.log 2>&1; echo "suite rc=$?"; cp /tmp/q/gpu_suite.* $OUT/ ;;
esac; done

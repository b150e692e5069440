# Issue 45, where a compiled command's seconds go: `bash gpu45c.sh PHASE...` from the project root on
# the device machine (carrying .device); everything it measures goes to $OUT. Phases: diag, pyc, cold, warm, fresh,
# nobench, freshbase, parts, profsingle, pack.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
R=recipes/fast99_graph.yaml
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, accelerate, deepspeed, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__)" > $OUT/versions.txt 2>&1
cat $OUT/gpu.txt $OUT/versions.txt
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache  # cold for the call's first compiled command
t() { date +%s.%N; }
summary() { python3 - "$@" <<'PY'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/results.json"))
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
hit = next((row["train_seconds"] for row in rows if row["test_accuracy"] >= 0.99), None)
print(json.dumps({"tag": sys.argv[2], "step": r.get("step"), "dynamo": r.get("dynamo_backend"), "lr": r.get("lr"),
  "steps": rows[-1]["step"], "to99_s": hit, "final": rows[-1]["test_accuracy"], "capture_s": r.get("capture_seconds"),
  "prewarm_s": r.get("prewarm_seconds"), "eval_s": r.get("eval_seconds"), "wall_s_inside": r.get("wall_seconds")}))
PY
}
# One command; its wall time, its summary line, its results.json copied.
cmd() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-120} "$@" > $OUT/$tag.log 2>&1; local rc=$?; local e=$(t)
  echo "{\"tag\": \"$tag\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($e-$s,2))")}" | tee -a $OUT/walls.jsonl
  [ -f /tmp/o_$tag/results.json ] && cp /tmp/o_$tag/results.json $OUT/results_$tag.json && summary /tmp/o_$tag $tag | tee -a $OUT/summary.jsonl; }
train() { local tag=$1; shift; cmd $tag python3 ${PROF:+-m cProfile -o $OUT/$tag.prof} -m accel_mnist train --config $R \
  --output-dir /tmp/o_$tag --overwrite --cudnn-benchmark --no-export "$@"; }
comp() { ACCELERATE_DYNAMO_BACKEND=INDUCTOR train "$@"; }  # the same command, compiled
for phase in "$@"; do case $phase in
diag)  # uncompiled and compiled commands, whole and under cProfile; then compiled without inductor's worker pool
  [ -n "$SKIP_BASE" ] || { train base_first --seed 0; train base --seed 0; PROF=1 train base_prof --seed 0; }
  LIMIT=200 PROF=1 comp compiled_cold_prof --seed 0 --lr 0.02
  PROF=1 comp compiled_warm_prof --seed 0 --lr 0.02
  comp compiled_warm --seed 0 --lr 0.02
  TORCHINDUCTOR_COMPILE_THREADS=1 comp compiled_warm_1thread --seed 0 --lr 0.02
  train base_again --seed 0 ;;
pyc)  # from here on Python's bytecode caches are written (the machine's packages are read-only), as in a user's install
  export PYTHONPYCACHEPREFIX=/tmp/pyc; train pyc_fill --seed 0 --max-steps 1 ;;
cold)  # cold compile caches: one compile thread, then inductor's worker pool (the first also writes the bytecode
  # of dynamo's and inductor's modules, so the comparison is against the one thread)
  LIMIT=200 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1 comp cold_1thread --seed 0 --lr 0.02
  LIMIT=200 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_pool comp cold_pool --seed 0 --lr 0.02 ;;
warm)  # warm caches, two rounds: uncompiled, compiled, compiled with one compile thread
  for r in 1 2; do train warm_base_$r --seed 0
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_pool comp warm_pool_$r --seed 0 --lr 0.02
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1 comp warm_1thread_$r --seed 0 --lr 0.02; done ;;
fresh)  # fresh compiled commands seed by seed until DEADLINE (epoch seconds): lr 0.02, warm cache, one compile thread
  for s in $(seq ${FROM:-0} 19); do [ $(date +%s) -lt ${DEADLINE:-0} ] || break
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1 comp fresh_compiled_$s --seed $s --lr 0.02; done ;;
nobench)  # without cuDNN's algorithm search (a whole command has it in prewarm): uncompiled, then compiled
  [ $(date +%s) -lt ${DEADLINE:-0} ] && train nobench_base --seed 0 --no-cudnn-benchmark
  [ $(date +%s) -lt ${DEADLINE:-0} ] && TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1 \
    comp nobench_1thread --seed 0 --lr 0.02 --no-cudnn-benchmark ;;
freshbase)  # the uncompiled recipe's fresh commands, seed by seed until DEADLINE
  for s in $(seq 0 19); do [ $(date +%s) -lt ${DEADLINE:-0} ] || break; train fresh_base_$s --seed $s; done ;;
parts)  # not run yet: what the prewarm buys a whole command (without it, kernels load inside the clock)
  train parts_base_noprewarm --seed 0 --no-prewarm
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1 comp parts_1thread_noprewarm --seed 0 --lr 0.02 \
    --no-prewarm ;;
profsingle)  # not run yet: --profile through accelerate_configs/single_gpu.yaml by name (issue 45's single_gpu)
  cmd profile_single_gpu accelerate launch --config_file accelerate_configs/single_gpu.yaml --main_process_port 0 \
    -m accel_mnist train --config $R --output-dir /tmp/o_profile_single_gpu --overwrite --max-steps 40 --profile 8 \
    --no-export --cudnn-benchmark ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
esac; done

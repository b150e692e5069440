# Issue 45, where each second of the compiled command goes: `bash gpu45d.sh PHASE...` from the project
# root on the device machine (carrying .device); everything it measures goes to $OUT.
# Phases: first, stacks, fresh, launches, parts, profsingle, pack.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16 PYTHONPYCACHEPREFIX=/tmp/pyc  # bytecode written, as in a user's install
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_one TORCHINDUCTOR_COMPILE_THREADS=1
R=recipes/fast99_graph.yaml
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, accelerate, deepspeed, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__)" > $OUT/versions.txt 2>&1
cat $OUT/gpu.txt $OUT/versions.txt
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
cmd() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-120} "$@" > $OUT/$tag.log 2>&1; local rc=$?; local e=$(t)
  echo "{\"tag\": \"$tag\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($e-$s,2))")}" | tee -a $OUT/walls.jsonl
  [ -f /tmp/o_$tag/results.json ] && cp /tmp/o_$tag/results.json $OUT/results_$tag.json && summary /tmp/o_$tag $tag | tee -a $OUT/summary.jsonl; }
# The recipe's command; STACKS=1 runs it under benchmarks/command_stacks.py (collapsed stacks to $OUT).
train() { local tag=$1; shift; cmd $tag python3 -m ${STACKS:+benchmarks.command_stacks --top 120 --out $OUT/$tag.stacks --} \
  accel_mnist train --config $R --output-dir /tmp/o_$tag --overwrite --cudnn-benchmark --no-export "$@"; }
comp() { ACCELERATE_DYNAMO_BACKEND=INDUCTOR train "$@"; }  # the same command, compiled
# The compiled recipe as README states it (recipes/fast99_compiled.yaml: lr 0.02, cuDNN's search, eager evaluation).
rec() { local tag=$1; shift; ACCELERATE_DYNAMO_BACKEND=INDUCTOR cmd $tag python3 -m \
  ${STACKS:+benchmarks.command_stacks --top 120 --out $OUT/$tag.stacks --} accel_mnist train \
  --config recipes/fast99_compiled.yaml --output-dir /tmp/o_$tag --overwrite --no-export "$@"; }
for phase in "$@"; do case $phase in
first)  # the machine's first command (disk caches cold), then the compile cache filled by the recipe's command
  train first_base --seed 0; LIMIT=200 rec first_recipe_cold --seed 0 ;;
stacks)  # warm: the uncompiled command and the recipe's, plain and under the sampler; the recipe with a compiled
  # evaluation beside them
  train base --seed 0; rec recipe --seed 0; STACKS=1 train base_stacks --seed 0; STACKS=1 rec recipe_stacks --seed 0
  rec recipe_compiled_eval --seed 0 --compile-evaluation; rec recipe_compiled_eval_warm --seed 0 --compile-evaluation ;;
fresh)  # the recipe's fresh commands seed by seed (FROM=, until DEADLINE in epoch seconds)
  for s in $(seq ${FROM:-0} 19); do [ $(date +%s) -lt ${DEADLINE:-0} ] || break; rec fresh_recipe_$s --seed $s; done ;;
launches)  # the prewarm's operations timed one by one, cold then warm, in fresh processes (bf16, cuDNN's search)
  cmd launches_timed python3 -m benchmarks.first_launches --config recipes/fast99_compiled.yaml --top 60
  cmd launches_untimed python3 -m benchmarks.first_launches --config recipes/fast99_compiled.yaml --untimed ;;
parts)  # what the prewarm buys a whole command (without it, kernels load inside the clock)
  train parts_base_noprewarm --seed 0 --no-prewarm; rec parts_recipe_noprewarm --seed 0 --no-prewarm ;;
profsingle)  # --profile through accelerate_configs/single_gpu.yaml by name (issue 45's single_gpu)
  cmd profile_single_gpu accelerate launch --config_file accelerate_configs/single_gpu.yaml --main_process_port 0 \
    -m accel_mnist train --config $R --output-dir /tmp/o_profile_single_gpu --overwrite --max-steps 40 --profile 8 \
    --no-export --cudnn-benchmark ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
esac; done

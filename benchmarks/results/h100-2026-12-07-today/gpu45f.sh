# Issue 45, "the command no slower than today's": the issue's own command (main at 0ec1b34, the tree in
# .device/old made by `git archive 0ec1b34 accel_mnist recipes`), the compiled recipe as the README states it
# and today's uncompiled fast99_graph.yaml, as fresh commands alternated under the same conditions (Python's
# bytecode cached, then not; inductor's cache warm, after one cold command). Every command gets the extra
# arguments the issue's harness gave it (benchmarks/suites.py, `recipe_graph`). `bash gpu45f.sh PHASE...`
# from the project root on the device machine (carrying .device); everything goes to $OUT.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_today
D=$ACCEL_MNIST_DATA_DIR
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
print(json.dumps({"tag": sys.argv[2], "steps": rows[-1]["step"], "to99_s": hit, "final": rows[-1]["test_accuracy"],
  "dynamo": r.get("dynamo_backend"), "lr": r.get("lr"), "capture_s": r.get("capture_seconds"),
  "prewarm_s": r.get("prewarm_seconds"), "eval_s": r.get("eval_seconds"), "wall_s_inside": r.get("wall_seconds")}))
PY
}
cmd() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-120} "$@" > $OUT/$tag.log 2>&1; local rc=$?; local e=$(t)
  echo "{\"tag\": \"$tag\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($e-$s,2))")}" | tee -a $OUT/walls.jsonl
  [ -f /tmp/o_$tag/results.json ] && cp /tmp/o_$tag/results.json $OUT/results_$tag.json && summary /tmp/o_$tag $tag | tee -a $OUT/summary.jsonl; }
args() { echo --seed $1 --data-dir $D --output-dir /tmp/o_$2 --overwrite --quiet; }
# The issue's command, from the tree it was measured on.
old() { local tag=$1 s=$2; cmd $tag env -C .device/old PYTHONPATH="$PWD/.device/old:/tmp/site" python3 -m accel_mnist \
  train --config recipes/fast99_graph.yaml $(args $s $tag); }
# Today's uncompiled recipe, the same arguments.
base() { local tag=$1 s=$2; cmd $tag python3 -m accel_mnist train --config recipes/fast99_graph.yaml $(args $s $tag); }
# The compiled recipe as the README states it.
rec() { local tag=$1 s=$2; ACCELERATE_DYNAMO_BACKEND=INDUCTOR cmd $tag python3 -m accel_mnist train \
  --config recipes/fast99_compiled.yaml $(args $s $tag); }
cached() ( unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; "$@" )
for phase in "$@"; do case $phase in
env) { env | grep -i -E '^PYTHON|PYC|TORCH' ; nproc; grep 'model name' /proc/cpuinfo | head -1; } > $OUT/env.txt 2>&1 ;;
first)  # the machine's first commands: the issue's, then the compiled recipe with a cold inductor cache
  old first_old 0; LIMIT=200 rec first_recipe_cold 0 ;;
fill)  # bytecode written to the prefix by one command of each
  cached old fill_old 0; cached rec fill_recipe 0; cached base fill_base 0 ;;
pairs)  # bytecode cached: the three alternated, seeds 1..N
  for i in $(seq ${PFROM:-1} ${CACHED:-4}); do cached old cached_old_$i $i; cached rec cached_recipe_$i $i
    cached base cached_base_$i $i; done ;;
uncached)  # the machine's own setting (no bytecode cached): the issue's command and the recipe alternated
  for i in $(seq ${UNCACHED:-2}); do old uncached_old_$i $i; rec uncached_recipe_$i $i; done ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
esac; done

# Issue 45's "the command no slower than today's", for a change of settings: today's uncompiled recipe
# (recipes/fast99_graph.yaml) with the flags in EXTRA (default: the fewer-steps settings of the CPU screen,
# benchmarks/results/cpu-2026-12-07-fewer-steps), as fresh commands over seeds 0-19, alternated with the
# issue's own command (main at 0ec1b34, the tree in .device/old made by
# `mkdir -p .device/old && git archive 0ec1b34 accel_mnist recipes | tar -x -C .device/old`) under the same
# conditions (bytecode cached). Every command gets the arguments the issue's harness gave its command
# (benchmarks/suites.py, `recipe_graph`). On the device machine, from the project root, carrying .device:
#     EXTRA="--lr 0.02 --cudnn-benchmark --ema-decay 0.95 --eval-every 5" bash benchmarks/fresh_commands.sh env fill seeds pack
# Everything goes to $OUT: walls.jsonl (seconds from outside), summary.jsonl (each run's steps, seconds to 99%).
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
EXTRA=${EXTRA:---lr 0.02 --cudnn-benchmark --ema-decay 0.95 --eval-every 5}
D=$ACCEL_MNIST_DATA_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, accelerate, deepspeed, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__)" > $OUT/versions.txt 2>&1
echo "$EXTRA" > $OUT/extra.txt
cat $OUT/gpu.txt $OUT/versions.txt $OUT/extra.txt
t() { date +%s.%N; }
summary() { python3 - "$@" <<'PY'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/results.json"))
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
hit = next((row["train_seconds"] for row in rows if row["test_accuracy"] >= 0.99), None)
print(json.dumps({"tag": sys.argv[2], "steps": rows[-1]["step"], "to99_s": hit, "final": rows[-1]["test_accuracy"],
  "ema_decay": r.get("ema_decay"), "capture_s": r.get("capture_seconds"), "prewarm_s": r.get("prewarm_seconds"),
  "eval_s": r.get("eval_seconds"), "wall_s_inside": r.get("wall_seconds")}))
PY
}
cmd() { local tag=$1; shift; local s=$(t); timeout ${LIMIT:-120} "$@" > $OUT/$tag.log 2>&1; local rc=$?; local e=$(t)
  echo "{\"tag\": \"$tag\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($e-$s,2))")}" | tee -a $OUT/walls.jsonl
  [ -f /tmp/o_$tag/results.json ] && summary /tmp/o_$tag $tag | tee -a $OUT/summary.jsonl; }
args() { echo --seed $1 --data-dir $D --output-dir /tmp/o_$2 --overwrite --quiet; }
old() { local tag=$1 s=$2; cmd $tag env -C .device/old PYTHONPATH="$PWD/.device/old:/tmp/site" python3 -m accel_mnist \
  train --config recipes/fast99_graph.yaml $(args $s $tag); }
new() { local tag=$1 s=$2; cmd $tag python3 -m accel_mnist train --config recipes/fast99_graph.yaml $EXTRA $(args $s $tag); }
cached() ( unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; "$@" )
for phase in "$@"; do case $phase in
env) { env | grep -i -E '^PYTHON|PYC|TORCH' ; nproc; grep 'model name' /proc/cpuinfo | head -1; } > $OUT/env.txt 2>&1 ;;
fill) cached old fill_old 0; cached new fill_new 0 ;;
seeds)  # the fresh commands: seeds 0-19, with the issue's command after every fourth
  for s in $(seq 0 19); do cached new new_$s $s; [ $((s % 4)) = 3 ] && cached old old_$s $s; done ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
esac; done

# Issue 45, the compiled command's seconds with Python's bytecode cached and not, and 20 fresh seeds of the
# compiled recipe with eager evaluations: `bash gpu45e.sh PHASE...` from the project root on the device
# machine (carrying .device); everything it measures goes to $OUT. Phases: env, first, fill, pairs,
# overlap, fresh, pack.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
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
# PY= replaces `python3 -m accel_mnist` (the overlap phase's wrapper).
train() { local tag=$1; shift; cmd $tag ${PY:-python3 -m accel_mnist} train --config $R --output-dir /tmp/o_$tag \
  --overwrite --cudnn-benchmark --no-export "$@"; }
# The compiled recipe as README states it, with eager evaluations (compile_evaluation false).
rec() { local tag=$1; shift; ACCELERATE_DYNAMO_BACKEND=INDUCTOR cmd $tag ${PY:-python3 -m accel_mnist} train \
  --config recipes/fast99_compiled.yaml --output-dir /tmp/o_$tag --overwrite --no-export --no-compile-evaluation "$@"; }
# Bytecode written and read from a prefix, as an install whose bytecode is cached has it.
cached() ( unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; "$@" )
# Starts inductor's import in a thread once torch is in, then runs the CLI: whether the imports overlap the
# GPU's first launches (which release the GIL).
wrap() { printf '%s\n' 'import sys, threading, runpy, torch' \
  'threading.Thread(target=lambda: __import__("torch._inductor.compile_fx"), daemon=True).start()' \
  'runpy.run_module("accel_mnist", run_name="__main__", alter_sys=True)' > /tmp/ovl.py; }
for phase in "$@"; do case $phase in
env)  # does this machine write bytecode, and where would it go
  { env | grep -i -E '^PYTHON|PYC' ; python3 -c "import sys, os, importlib.util, torch._inductor.compile_fx as m
print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix)
print('cached', m.__cached__, os.path.exists(m.__cached__), 'writable', os.access(os.path.dirname(m.__file__), os.W_OK))"
    nproc; cat /proc/cpuinfo | grep 'model name' | head -1; } > $OUT/env.txt 2>&1; cat $OUT/env.txt ;;
first)  # the machine's first command (disk caches cold, bytecode not cached); the compile cache filled
  train first_base --seed 0; LIMIT=200 rec first_recipe_cold --seed 0 ;;
fill)  # the bytecode prefix filled by one command of each
  cached train fill_base --seed 0; cached rec fill_recipe --seed 0 ;;
pairs)  # uncompiled and compiled alternated, bytecode cached, then not
  for i in $(seq ${PFROM:-1} ${CACHED:-3}); do cached train cached_base_$i --seed 0; cached rec cached_recipe_$i --seed 0; done
  for i in $(seq ${UNCACHED:-2}); do train uncached_base_$i --seed 0; rec uncached_recipe_$i --seed 0; done ;;
overlap)  # inductor's import started in a thread, against the same command without, bytecode cached
  for i in 1 2 3; do cached rec ovl_plain_$i --seed 0; wrap; PY="python3 /tmp/ovl.py" cached rec ovl_thread_$i --seed 0; done ;;
fresh)  # the recipe's fresh commands seed by seed, bytecode cached (FROM=, until DEADLINE in epoch seconds)
  for s in $(seq ${FROM:-0} 19); do [ $(date +%s) -lt ${DEADLINE:-0} ] || break; cached rec fresh_recipe_$s --seed $s; done ;;
pack) tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . ; ls -la $OUT/all.tgz ;;
esac; done

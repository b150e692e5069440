# Issue 45, fewer steps without compilation: fast99_graph.yaml's seeds 0-19 in one process
# (benchmarks/repeat.py) with a larger batch, its learning rate and evaluations every few steps, and NCHW
# against channels-last. `bash gpu45g.sh VARIANT...` from the project root on the device machine (carrying
# .device); each variant's JSON line goes to $OUT/repeat_VARIANT.log. Stops starting variants after DEADLINE.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16 TORCHINDUCTOR_CACHE_DIR=/tmp/ind_batch
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, accelerate, deepspeed, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'accelerate', accelerate.__version__, 'deepspeed', deepspeed.__version__)" > $OUT/versions.txt 2>&1
cat $OUT/gpu.txt $OUT/versions.txt
declare -A V=(
  [lr2]="--set lr=0.02"
  [nchw]="--set lr=0.02 --set channels_last=false"
  [b1024_lr3]="--set batch_size=1024 --set lr=0.03 --set eval_every=5"
  [b1024_lr4]="--set batch_size=1024 --set lr=0.04 --set eval_every=5"
  [b1024_lr4_nchw]="--set batch_size=1024 --set lr=0.04 --set eval_every=5 --set channels_last=false"
  [b1024_lr3_ls]="--set batch_size=1024 --set lr=0.03 --set eval_every=5 --set label_smoothing=0.1"
  [b2048_lr6]="--set batch_size=2048 --set lr=0.06 --set eval_every=3 --set epochs=3"
  [b768_lr3]="--set batch_size=768 --set lr=0.03 --set eval_every=5"
)
for v in "$@"; do
  [ $(date +%s) -lt ${DEADLINE:-9999999999} ] || { echo "deadline: $v not started"; continue; }
  comp=""; name=$v; case $v in c_*) comp=INDUCTOR; name=${v#c_};; esac
  s=$(date +%s.%N)
  ACCELERATE_DYNAMO_BACKEND=${comp:-NO} timeout ${LIMIT:-100} python3 -m benchmarks.repeat --config recipes/fast99_graph.yaml \
    --seeds 0-19 --set cudnn_benchmark=true ${V[$name]} > $OUT/repeat_$v.log 2>&1
  rc=$?; e=$(date +%s.%N)
  python3 - $OUT/repeat_$v.log $v $rc $s $e <<'PY'
import json, sys
path, v, rc, s, e = sys.argv[1:]
line = next((l for l in open(path) if l.startswith("{")), None)
if line is None:
    print(json.dumps({"variant": v, "rc": int(rc), "wall_s": round(float(e) - float(s), 1)})); sys.exit()
r = json.loads(line)
steps = [x["steps"] for x in r["seeds"]]
ms = [1000 * x["seconds_to_target"] / x["steps"] for x in r["seeds"] if x["seconds_to_target"]]
print(json.dumps({"variant": v, "rc": int(rc), "wall_s": round(float(e) - float(s), 1), "share": r["share_reached"],
  "mean_s": r["mean_seconds"], "max_s": r["max_seconds"], "min_s": r["min_seconds"], "mean_steps": sum(steps) / len(steps),
  "ms_per_step": round(sum(ms) / max(len(ms), 1), 3), "eager": sorted({str(x.get("eager_reason")) for x in r["seeds"]})}))
PY
done | tee $OUT/screen.jsonl
tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz .

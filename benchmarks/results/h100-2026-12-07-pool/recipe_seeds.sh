# The shipped recipe itself as fresh commands, seeds 0-19 (Python's bytecode cached after a first command),
# with each run's seconds to 99% in $OUT/summary.jsonl and the walls in $OUT/walls.jsonl.
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
run() { local s=$(date +%s.%N); timeout 60 python3 -m accel_mnist train --config recipes/fast99_pool.yaml --seed $2 \
    --data-dir $ACCEL_MNIST_DATA_DIR --output-dir /tmp/r_$1 --overwrite --quiet > $OUT/$1.log 2>&1; local rc=$?
  echo "{\"tag\": \"$1\", \"rc\": $rc, \"wall_s\": $(python3 -c "print(round($(date +%s.%N)-$s,2))")}" >> $OUT/walls.jsonl
  python3 - /tmp/r_$1 $1 >> $OUT/summary.jsonl <<'PY'
import json, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
hit = next((r["train_seconds"] for r in rows if r["test_accuracy"] >= 0.99), None)
print(json.dumps({"tag": sys.argv[2], "steps": rows[-1]["step"], "to99_s": hit, "final": rows[-1]["test_accuracy"]}))
PY
}
run fill_new 0
for s in $(seq 0 19); do run new_$s $s; done
cat $OUT/gpu.txt; python3 benchmarks/results/h100-2026-12-07-pool/tally.py $OUT

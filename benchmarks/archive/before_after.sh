#!/bin/bash
# Before/after, fresh processes, interleaved: BASE = main at 47cc19d (before this branch), NEW = the branch.
#   mkdir -p $BASE && git archive 47cc19d accel_mnist benchmarks | tar -x -C $BASE
#   bash run.sh OUT ROUNDS THREADS    (run here: ROUNDS=2, THREADS=2 and 1)
# "base index_select" and "new normalised" are the loops alone: the plain loop gathers as each
# version's DeviceLoader does (per-batch normalisation before, a split normalised once after).
BASE=${BASE:-/tmp/stp/base} NEW=${NEW:-$(git rev-parse --show-toplevel)}
export ACCEL_MNIST_DATA_DIR=${ACCEL_MNIST_DATA_DIR:-../shared/data/mnist} CUDA_VISIBLE_DEVICES=
out=$1; rounds=$2; threads=$3
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for spec in "base index" "new index" "base index_select" "new normalised"; do
    set -- $spec; side=$1; g=$2
    dir=$BASE; [ "$side" = new ] && dir=$NEW
    echo "== $side gather=$g round $r load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH=$dir python -m benchmarks.cpu_overhead --models linear --threads "$threads" --repeats 3 \
       --steps linear=300 --plain-gather "$g" --out "$out/$side-$g-$r" 2>/dev/null | tail -1)
  done
done

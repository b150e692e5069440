# Issue 45, one device call: the pooled BNCNN with the average of the weights as fresh commands beside the
# issue's own command, then the fewer_steps rows in one process, then kernels and microseconds per step.
# From the project root on the device machine, carrying .device (with .device/old, see fresh_commands.sh).
source .device/setup.sh || exit 1
export ACCELERATE_MIXED_PRECISION=bf16
H=benchmarks/results/gpu-2026-12-07-pool  # named for the card after the call: h100-2026-12-07-pool
export EXTRA="--lr 0.02 --cudnn-benchmark --ema-decay 0.95 --eval-every 5 --model bncnn_pool"
timeout 300 bash benchmarks/fresh_commands.sh env fill seeds > $OUT/fresh.txt 2>&1
python3 $H/tally.py $OUT
prof() { timeout 60 python3 -m accel_mnist train --config recipes/fast99_graph.yaml --max-steps 40 --profile 8 \
  --no-export --cudnn-benchmark --lr 0.02 --data-dir $ACCEL_MNIST_DATA_DIR --output-dir /tmp/p_$1 --overwrite "${@:2}" > $OUT/prof_$1.log 2>&1
  grep -A8 "^profile:" $OUT/prof_$1.log; }
prof bncnn; prof pool --model bncnn_pool; prof pool_ema --model bncnn_pool --ema-decay 0.95
timeout 200 python3 -m benchmarks h200_speed --group fewer_steps --row fewer_pool_first_ema095_eval5 \
  --row fewer_ema095_eval5 --row fewer_pool_first --recipe recipes/fast99_graph.yaml --budget 130 \
  --out $OUT/fewer > $OUT/fewer.txt 2>&1; tail -5 $OUT/fewer.txt
bash benchmarks/fresh_commands.sh pack

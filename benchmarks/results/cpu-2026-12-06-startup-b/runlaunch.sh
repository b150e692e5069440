#!/bin/sh
cd "$1" && ACCEL_MNIST_DATA_DIR=/work/shared/data/mnist OMP_NUM_THREADS=1 exec /work/main/.venv/bin/accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 1 --mixed_precision no --main_process_port 0 -m accel_mnist train --model linear --max-steps 1 --no-export --no-plots --quiet --overwrite --output-dir /tmp/launchbench-$(basename $1)

#!/bin/bash
cd "$1" && ACCEL_MNIST_DATA_DIR=/work/shared/data/mnist exec /work/main/.venv/bin/python -m accel_mnist train --model linear --epochs 3 --batch-size 1000 --eval-every 0 --no-export --no-plots --no-save-checkpoints --quiet --overwrite --output-dir /tmp/torchbench-$(basename $1) --data-loader torch --num-workers 2

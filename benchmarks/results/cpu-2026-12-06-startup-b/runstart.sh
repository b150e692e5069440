#!/bin/sh
cd "$1" && ACCEL_MNIST_DATA_DIR=/work/shared/data/mnist exec /work/main/.venv/bin/python -m accel_mnist train --model linear --max-steps 1 --no-export --no-plots --quiet --overwrite --output-dir /tmp/startbench-$(basename $1)

#!/bin/bash
# The setup of the blog post this project grew from, under DeepSpeed's own launcher: a linear
# model (784 -> 10) on MNIST, Adam at lr 3e-4, batch 64, 5 epochs, and the post's DeepSpeed
# config as it stands (ds_config.json: train_batch_size 64, fp16, ZeRO stage 2). The post's
# hand-written loop becomes accel_mnist's: the same model, optimizer and batch, plus
# evaluation, checkpoints, export and results.json.
#
#   bash examples/deepspeed/train.sh                  # one GPU
#   NUM_GPUS=4 bash examples/deepspeed/train.sh       # 4 GPUs, 64 per GPU (a line says the JSON's 64 becomes 256)
#   DS_CONFIG=examples/deepspeed/ds_config_cpu.json bash examples/deepspeed/train.sh --max-steps 50
#                                                     # a machine without a GPU: the same JSON in fp32
#
# Run from the repo root. Extra arguments go to `accel_mnist train` and win over the ones
# here (e.g. --epochs 1, --output-dir DIR, --resume-from auto).
set -euo pipefail

DEEPSPEED=${DEEPSPEED:-deepspeed}
DS_CONFIG=${DS_CONFIG:-examples/deepspeed/ds_config.json}

exec "$DEEPSPEED" --num_gpus "${NUM_GPUS:-1}" --master_port "${MASTER_PORT:-29500}" --module accel_mnist train \
  --deepspeed --deepspeed_config "$DS_CONFIG" \
  --model linear --optimizer adam --lr 3e-4 --batch-size 64 --epochs 5 \
  --output-dir outputs/deepspeed_seed "$@"

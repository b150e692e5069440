"""Reference trainers without accel_mnist's loop: plain PyTorch and the seed blog post's script."""

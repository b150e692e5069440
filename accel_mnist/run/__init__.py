"""A run's directory: its files, checkpoints, the weights inside them, and loading them safely."""

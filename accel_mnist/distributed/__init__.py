"""What Accelerate set up, and the one place that knows strategies: setup, checks, the step, rank agreement."""

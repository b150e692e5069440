"""The training loop and what it asks each step: loaders, loss tally, prewarm, preemption, cadence."""

"""Memory: what each process holds and predicts (model states, activations, the peak), and out-of-memory advice."""

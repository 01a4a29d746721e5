"""Training: loss, optimizer, train state, pure train/eval steps, checkpoints and the loop."""

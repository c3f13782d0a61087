"""Training on top of the strategies: losses, optimizers, metrics, checkpoints and a fit loop
that run unchanged under every strategy."""

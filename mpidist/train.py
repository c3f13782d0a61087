"""``mpidist.train``: saving and restoring training state (``tf.train``'s checkpoint names)."""

from mpidist.training.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint

__all__ = ["Checkpoint", "CheckpointManager", "latest_checkpoint"]

"""``mpidist.nn``: loss scaling for synchronous training (``tf.nn`` counterparts)."""

from mpidist.training.losses import compute_average_loss, scale_regularization_loss

__all__ = ["compute_average_loss", "scale_regularization_loss"]

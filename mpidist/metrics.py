"""``mpidist.metrics``: streaming metrics on SyncOnRead variables (tf.keras.metrics names).

Accumulated per replica without communication inside ``strategy.run``; ``result()`` sums over
every replica of every worker. See docs/metrics.md.
"""

from mpidist.training.metrics import (
    Accuracy,
    Mean,
    Metric,
    SparseCategoricalAccuracy,
    Sum,
)

__all__ = ["Accuracy", "Mean", "Metric", "SparseCategoricalAccuracy", "Sum"]

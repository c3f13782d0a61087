"""Keras 3 models (JAX backend) under mpidist's strategies (docs/keras.md).

Nothing to call: entering a strategy's scope with Keras imported installs the integration, and
a model built and compiled in that scope is then trained by ``model.fit`` across the strategy's
replicas, as with tf.distribute. ``install()`` does it by hand (idempotent). Importing this
package does not import Keras.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["install", "install_if_keras_imported"]


def install() -> None:
    """Install mpidist's distribution of Keras models (imports Keras)."""
    from mpidist.keras.integration import install as _install  # noqa: PLC0415 - imports Keras
    _install()


def install_if_keras_imported(strategy: Any = None) -> None:
    """The scope-entry hook: install when the process has imported Keras."""
    if "keras" in sys.modules:
        install()

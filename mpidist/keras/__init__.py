"""Keras 3 models (JAX backend) under mpidist's strategies (docs/keras.md).

Nothing to call: entering a strategy's scope with Keras imported installs the integration, and
a model built and compiled in that scope is then trained by ``model.fit`` across the strategy's
replicas, as with tf.distribute. ``install()`` does it by hand (idempotent). Importing this
package does not import Keras.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

__all__ = ["install", "install_if_keras_imported", "prefer_jax_backend"]


def prefer_jax_backend() -> None:
    """Make JAX the backend Keras will load, unless ``KERAS_BACKEND`` is set, Keras's config
    file names another backend than its default (TensorFlow, which Keras writes there at its
    first import), or Keras is imported already. mpidist does not use TensorFlow, so
    ``import mpidist`` before ``import keras`` then just works."""
    if "keras" in sys.modules or "KERAS_BACKEND" in os.environ:
        return
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            if json.load(f).get("backend", "tensorflow") != "tensorflow":
                return
    except (OSError, ValueError, AttributeError):
        pass
    os.environ["KERAS_BACKEND"] = "jax"


_installed = [False]


def install() -> None:
    """Install mpidist's distribution of Keras models (imports Keras)."""
    from mpidist.keras.integration import install as _install  # noqa: PLC0415 - imports Keras
    _install()
    _installed[0] = True


def install_if_keras_imported(strategy: Any = None) -> None:
    """The scope-entry hook: install when the process has imported Keras. Every scope entry
    runs it, so once installed it costs one list lookup."""
    if not _installed[0] and "keras" in sys.modules:
        install()

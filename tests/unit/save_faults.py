"""What the save-fault tests share (tests/unit/test_durable_saves.py and
tests/scenarios/test_saves_killed_at_every_operation.py): a small model trained by fit, the
file operations a save makes (mpidist.core.durable's seam), a save killed at its k-th
operation in a forked child, and a hook that fails the k-th write, fsync or close."""

import itertools
import os
import signal

import numpy as np

import mpidist
from mpidist.core import durable
from mpidist.data import Dataset
from linear_model import LinearModel

RNG = np.random.default_rng(0)
X = RNG.standard_normal((40, 2))
Y = X @ np.array([1.5, -2.0]) + 0.3


def train(callbacks=(), epochs=3):
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = LinearModel()
        optimizer = mpidist.optimizers.SGD(0.05, momentum=0.5)
    ds = Dataset.from_tensor_slices((X, Y)).shuffle(40, seed=2).batch(8)
    mpidist.fit(model, ds, epochs=epochs, optimizer=optimizer, strategy=strategy,
                callbacks=list(callbacks), verbose=0)
    return [np.asarray(v.numpy()) for v in model.trainable_variables]


# -- the seam -------------------------------------------------------------------------------
def operations(action):
    """The file operations ``action()`` makes, in order: [(operation, path)]."""
    seen = []
    with durable.inject(lambda op, path: seen.append((op, path))):
        action()
    return seen


def killed_at(k, action):
    """Run ``action()`` in a forked child that SIGKILLs itself at its ``k``-th file operation;
    True if it was killed there (False: it finished first)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            count = itertools.count()

            def hook(op, path):
                if next(count) == k:
                    os.kill(os.getpid(), signal.SIGKILL)

            with durable.inject(hook):
                action()
        except BaseException:  # noqa: BLE001 - reported by the exit status
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3), \
        f"the save raised instead of being killed at operation {k}"
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def failing(k, code):
    """A hook raising OSError(code) at the k-th write, fsync or close."""
    count = itertools.count()

    def hook(op, path):
        if op in ("write", "fsync", "close") and next(count) == k:
            raise OSError(code, os.strerror(code))
    return hook


def count_faultable(ops):
    return sum(op in ("write", "fsync", "close") for op, _ in ops)



def plain(value):
    return mpidist.Variable(np.asarray(value, np.float64))

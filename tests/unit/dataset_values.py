"""Datasets' elements as plain Python values (lists, tuples, dicts), for comparing with the
values TF's documentation prints."""

import numpy as np


def py(x):
    """An element as plain Python values, keeping tuple / dict structure."""
    if isinstance(x, dict):
        return {k: py(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(py(v) for v in x)
    return np.asarray(x).tolist()


def values(ds):
    return [py(e) for e in ds]

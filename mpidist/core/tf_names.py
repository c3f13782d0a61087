"""Names TensorFlow users reach for that mpidist does not have, answered with the fix.

A TF 1.x name (``make_one_shot_iterator``, ``v.eval()``), a renamed one
(``experimental_run_v2``) or a Keras 2 alias (``optimizer.lr``) used to end in a bare
AttributeError. ``tf_name_hints(family)`` decorates a public class with one descriptor per
known name of its family's table: reading it raises the same AttributeError with what to
write instead (so ``hasattr`` stays False and ``getattr`` with a default works). Descriptors,
not ``__getattr__``: that would be called on every failed lookup, and NumPy looks up several
(``__array_interface__``, ...) each time it converts a variable, which it made 4x slower.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

__all__ = ["tf_name_hints", "missing_attribute"]

_C = TypeVar("_C", bound=type)

_ITERATE = "iterate the dataset instead: `for element in dataset:` or `iter(dataset)`"
_GRADIENTS = ("compute them with mpidist.autodiff.value_and_grad(loss_fn, variables) and apply "
              "them with optimizer.apply_gradients(zip(grads, variables)), or call "
              "optimizer.minimize(loss, var_list)")

# {public class name: {missing TF name: what to write instead}}
_HINTS: dict[str, dict[str, str]] = {
    "Strategy": {
        "experimental_run_v2": "TF 2.2 renamed it: strategy.run(fn, args=(...), kwargs={...})",
        "make_dataset_iterator": "a TF 1 name: iterate strategy.experimental_distribute_dataset("
                                 "dataset) (`for batch in dist:` or `iter(dist)`)",
        "make_input_fn_iterator": "a TF 1 name: use strategy.distribute_datasets_from_function("
                                  "dataset_fn)",
        "experimental_make_numpy_dataset": "removed in TF 2.4: use mpidist.data.Dataset."
                                           "from_tensor_slices(arrays)",
        "unwrap": "a TF 1 name: use strategy.experimental_local_results(value)",
        "configure": "a TF 1 name: give the settings to the strategy's constructor "
                     "(cluster_resolver=..., communication_options=...)",
    },
    "Optimizer": {
        "get_gradients": _GRADIENTS,
        "compute_gradients": _GRADIENTS,
        "get_updates": _GRADIENTS,
        "lr": "Keras 2's alias, gone in Keras 3: use optimizer.learning_rate",
    },
    "Variable": {
        "eval": "a TF 1 name: use v.numpy() (or np.asarray(v))",
        "load": "a TF 1 name: use v.assign(value)",
        "initializer": "a TF 1 graph operation: a variable holds its initial value from its "
                       "creation, nothing needs to run",
    },
    "Dataset": {
        "make_one_shot_iterator": f"a TF 1 name: {_ITERATE}",
        "make_initializable_iterator": f"a TF 1 name: {_ITERATE}",
        "output_shapes": "a TF 1 name: use dataset.element_spec",
        "output_types": "a TF 1 name: use dataset.element_spec",
        "output_classes": "a TF 1 name: use dataset.element_spec",
    },
}


def missing_attribute(family: str, obj: object, name: str) -> NoReturn:
    """Raise the AttributeError for ``obj``'s missing ``name`` (``family``: the table), with
    the fix where ``name`` is a TensorFlow name the table knows."""
    hint = _HINTS.get(family, {}).get(name)
    message = f"{type(obj).__name__!r} object has no attribute {name!r}"
    raise AttributeError(f"{message}: {hint}." if hint else message)


class _TFName:
    """A TensorFlow name the class lacks: reading it raises AttributeError with the fix."""

    def __init__(self, family: str, name: str) -> None:
        self._family, self._name = family, name

    def __get__(self, obj: object, owner: type | None = None) -> NoReturn:
        missing_attribute(self._family, obj if obj is not None else owner, self._name)


def tf_name_hints(family: str) -> Callable[[_C], _C]:
    """Class decorator: the names of ``family``'s table that the class lacks answer with
    their fix (a subclass that defines one keeps its own)."""
    def decorate(cls: _C) -> _C:
        for name in _HINTS[family]:
            if not hasattr(cls, name):
                setattr(cls, name, _TFName(family, name))
        return cls
    return decorate


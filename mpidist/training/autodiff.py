"""Gradients of a loss written in array code, from autograd (NumPy) or JAX.

TensorFlow's guide computes a step's gradients with a ``GradientTape``. Its NumPy counterpart
here is functional, as in autograd and JAX: the loss function takes the variables' values as
its first argument and returns a scalar.

    def loss_fn(params, x, y):
        w, b = params
        per_example = cross_entropy(x @ w + b, y)   # written with autograd.numpy / jax.numpy
        return mpidist.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)

    loss, grads = mpidist.autodiff.value_and_grad(loss_fn, model.trainable_variables, x, y)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

Backends (optional extras): ``autograd`` differentiates NumPy code on CPU replicas; ``jax``
runs on CPU, and on GPU replicas takes CuPy arrays through DLPack (no copy) and hands its
gradients back the same way. ``backend=None`` picks autograd for host arrays and JAX for
device arrays. A trace replaces ``GradientTape`` because both libraries differentiate a
function, not a block of statements.
"""

from __future__ import annotations

import functools
import numbers
import operator
import os
import sys
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpidist.backend import array_module, cupy_backend
from mpidist.backend.traced import namespace_of, traced_kind
from mpidist.core.messages import named_instance, short_repr
from mpidist.core.signatures import accepts
from mpidist.strategies.context import get_strategy
from mpidist.training.losses import check_per_example
from mpidist.training.traced_errors import (TracedValueError, UnusedVariableWarning, explain,
                                            unused_message)
from mpidist.values.variables import (Variable, record_direct_reads, traced_reads,
                                      with_traced_values)

__all__ = ["value_and_grad", "BACKENDS", "model_loss_and_gradients", "model_per_example_loss",
           "TracedValueError", "UnusedVariableWarning", "gradients_for_minimize"]

BACKENDS = ("autograd", "jax")
_EXTRA = {"autograd": "autograd", "jax": "jax"}


@accepts(backend=str | None, has_aux=bool, jit=bool)  # fn, backend's value: the body's messages
def value_and_grad(fn: Any, variables: Any, *args: Any, backend: str | None = None,
                   has_aux: bool = False, jit: bool = False, **kwargs: Any) -> Any:
    """``(loss, gradients)`` of ``fn(params, *args, **kwargs)`` with respect to ``variables``.

    Args:
        fn: The loss function. Its first argument receives the variables' current values, in
            the structure ``variables`` has (a list for a list, one array for one variable),
            traced by the backend; it must return a real scalar (with ``has_aux``, a pair
            ``(scalar, aux)``). Write it with the backend's array functions
            (``autograd.numpy`` / ``jax.numpy``); ``mpidist.nn.compute_average_loss`` and
            ``scale_regularization_loss`` accept traced values.
        variables: A Variable, or a list / tuple of them (``model.trainable_variables``). In
            ``strategy.run`` each replica differentiates its own copy.
        *args, **kwargs: Passed to ``fn`` after the parameters (the batch, ...).
        backend: ``"autograd"``, ``"jax"``, or None for autograd on host arrays and JAX on
            GPU arrays.
        has_aux: ``fn`` returns ``(loss, aux)``; ``aux`` (any nest of arrays) comes back with
            the loss as plain arrays: ``((loss, aux), gradients)``.
        jit: JAX only (``backend=None`` then means JAX): compile the loss and its gradient
            together with ``jax.jit``, once per ``fn`` and argument shapes, and reuse the
            compiled code on later calls. As with ``jax.jit``, ``fn`` must be pure: Python side
            effects in it (a metric's update, a print) run only while it is compiled, and
            ``*args`` are its traced inputs (pass no ``**kwargs``; bind settings with
            ``functools.partial``).

    Returns:
        ``(loss, gradients)``: the loss as a 0-d array of the variables' kind (NumPy or CuPy)
        and one gradient per variable, in the order and structure of ``variables``, each an
        array of that variable's shape, dtype and kind, ready for ``apply_gradients``.

    Raises:
        TracedValueError: the loss did to a traced value what only an array allows (took a
            Python number out of it, wrote into it, stored it in a NumPy array, mixed
            ``jax.numpy`` with autograd, ...); the message says what and the fix, and the
            backend's own error is its ``__cause__``. A TypeError and a ValueError.
        TypeError: ``variables`` holds something that is not a Variable, or a variable that
            is not floating point (integer, bool: it has no gradient; TF's tape gives None),
            named with its position; or ``fn`` is not callable.
        ValueError: a variable belongs to another strategy, the loss is not a real scalar,
            or JAX would compute float64 variables in float32.
        ImportError: the backend is not installed (it names the extra to install).

    Warns:
        UnusedVariableWarning: the loss does not depend on some of ``variables`` (their
            gradients are exactly zero), checked the first time a loss function is
            differentiated with respect to given variables; or it read one of them directly
            (``w``, ``w.numpy()``) instead of through ``params``.
    """
    if not callable(fn):
        raise TypeError(f"value_and_grad: fn must be callable (the loss function), got "
                        f"{short_repr(fn)}.")
    single = isinstance(variables, Variable)
    variable_list = _variable_list(variables)
    loss, aux, grads, _ = _differentiate(fn, variable_list, single, isinstance(variables, tuple),
                                         args, kwargs, backend, has_aux, jit)
    out_grads = grads[0] if single else (tuple(grads) if isinstance(variables, tuple) else grads)
    return ((loss, aux), out_grads) if has_aux else (loss, out_grads)


def gradients_for_minimize(loss: Any, arity: int, variables: Sequence[Variable],
                           caller: str) -> tuple[Any, list[Any]]:
    """``(loss value, gradients)`` of ``Optimizer.minimize``'s ``loss`` with respect to
    ``variables`` (a list), the gradient of a variable the loss does not use being None, as
    TF's tape gives it (``apply_gradients`` skips such a pair).

    ``arity`` says how ``loss`` is called: 0, TF's ``loss()``, which reads the variables
    themselves (they read as traced values meanwhile: ``traced_reads``); 1, value_and_grad's
    ``loss(params)`` with the variables' values in their order. ``caller`` names the call in
    errors. The backend is picked as value_and_grad's ``backend=None`` picks it."""
    _variable_list(variables, caller, "var_list")
    if arity == 0:
        _autograd_sees_traced_variables()

        def fn(params: Any) -> Any:
            with traced_reads(variables, params, caller):
                return loss()
        fn.__wrapped__ = loss  # type: ignore[attr-defined]  # checks are keyed by the loss
    else:
        fn = loss
    value, _, grads, unused = _differentiate(fn, list(variables), False, False, (), {}, None,
                                             False, False, every_call=True, caller=caller,
                                             argument="var_list")
    return value, [None if i in unused else g for i, g in enumerate(grads)]


def _differentiate(fn: Any, variable_list: list[Variable], single: bool, as_tuple: bool,
                   args: Any, kwargs: Any, backend: str | None, has_aux: bool, jit: bool,
                   every_call: bool = False, caller: str = "value_and_grad",
                   argument: str = "variables") -> tuple[Any, Any, list[Any], Sequence[int]]:
    """value_and_grad's work: ``(loss, aux, gradients, unused)``, ``unused`` the positions of
    the variables the loss does not use, found the first time ``fn`` is differentiated with
    respect to these variables (when the UnusedVariableWarning is given), or at every call
    with ``every_call``."""
    _check_strategy(variable_list, caller)
    params = [v.current_array() for v in variable_list]
    _check_floating(variable_list, params, single, caller, argument)
    if jit:
        if backend not in (None, "jax"):
            raise ValueError(f"value_and_grad(jit=True) compiles with JAX; backend={backend!r} "
                             "cannot: use backend='jax' (or None), or jit=False.")
        if kwargs:
            raise ValueError(
                f"value_and_grad(jit=True): keyword arguments {sorted(kwargs)} cannot be traced "
                "inputs of the compiled function; pass them positionally, or bind settings with "
                "functools.partial(fn, ...).")
        backend = "jax"
    name = _backend_for(backend, params)
    if single:
        structured = params[0]
    else:
        structured = tuple(params) if as_tuple else params

    if name == "jax":
        # A CuPy batch (what GPU prefetch delivers) goes to JAX through DLPack like the
        # parameters: neither jax.jit nor jax.numpy accepts a cupy.ndarray.
        args, kwargs = _jax_leaves(args), _jax_leaves(kwargs)

    def loss_of(p: Any) -> Any:
        return _loss_and_aux(fn(p, *args, **kwargs), has_aux)

    first = _first_time(fn, variable_list)
    check = first or every_call
    with record_direct_reads() as reads:
        try:
            if jit:
                loss, aux, grads, unused = _with_jax(
                    loss_of, structured, single, params, compiled=_compiled(fn, has_aux),
                    args=args, check=check)
            else:
                differentiate = _with_autograd if name == "autograd" else _with_jax
                loss, aux, grads, unused = differentiate(loss_of, structured, single, params,
                                                         check=check)
        except Exception as err:  # re-raised, explained when it is a known slip
            explained = explain(err, name)
            if explained is None:
                raise
            raise explained from err
    if (unused and first) or reads:
        _warn_unused(variable_list, unused if first else (), reads, caller)
    return loss, aux, [_like(g, v) for g, v in zip(grads, params)], unused


# -- arguments -------------------------------------------------------------------------------
def _variable_list(variables: Any, caller: str = "value_and_grad",
                   argument: str = "variables") -> list[Any]:
    """``variables`` (a Variable, or a list / tuple of them) as a list, checked: TypeError /
    ValueError naming ``caller``, ``argument`` and the fix, before anything is traced."""
    if isinstance(variables, Variable):
        return [variables]
    if not isinstance(variables, (list, tuple)):
        raise TypeError(
            f"{caller}: {argument} must be a Variable or a list / tuple of them (e.g. "
            f"model.trainable_variables), got {short_repr(variables)}.")
    if not variables:
        raise ValueError(f"{caller}: {argument} is empty; pass the variables to "
                         "differentiate with respect to (e.g. model.trainable_variables).")
    for i, v in enumerate(variables):
        if not isinstance(v, Variable):
            raise TypeError(
                f"{caller}: {argument}[{i}] is {short_repr(v)}, not an mpidist.Variable; "
                "create the model's parameters as mpidist.Variable inside strategy.scope().")
    return list(variables)


def _check_floating(variables: Sequence[Variable], params: Sequence[Any], single: bool,
                    caller: str, argument: str) -> None:
    """A gradient exists for a floating-point (or complex) variable only. TF's tape gives None
    for an integer or boolean one, with a logged warning; here it is a TypeError naming the
    variable before anything is traced (the backend would fail on it with its own casting
    error, the variable unnamed). Checked on the values' dtypes, in C (a set of a few)."""
    if all(d.kind in "fc" for d in set(map(_DTYPE, params))):
        return
    i = next(i for i, p in enumerate(params) if p.dtype.kind not in "fc")
    raise _not_floating(variables[i], caller, "" if single else f"{argument}[{i}] ")


_DTYPE = operator.attrgetter("dtype")


def _not_floating(variable: Variable, caller: str, position: str) -> TypeError:
    return TypeError(
        f"{caller}: {position}variable {variable.name!r} has dtype {variable.dtype}, and "
        "gradients exist for floating-point variables only. Create it with a float dtype "
        "(dtype=np.float32, or an initial value such as 0.0 rather than 0), or leave it out of "
        "the variables differentiated (a counter or a mask: trainable=False, and "
        "differentiate model.trainable_variables).")


def _check_strategy(variables: Any, caller: str = "value_and_grad") -> None:
    current = get_strategy()
    for v in variables:
        owner = v.distribute_strategy
        if owner is not None and owner is not current:
            raise ValueError(
                f"{caller}: variable {v.name!r} belongs to {named_instance(owner)} but "
                f"this step runs under {named_instance(current)}; differentiate a model "
                "created inside the scope of the strategy that runs the step.")


def _backend_for(backend: str | None, params: Any) -> str:
    on_gpu = any(array_module(p) is not np for p in params)
    if backend is None:
        backend = "jax" if on_gpu else "autograd"
    if backend not in BACKENDS:
        raise ValueError(f"value_and_grad: backend must be one of {BACKENDS} or None, got "
                         f"{backend!r}.")
    if backend == "autograd" and on_gpu:
        raise ValueError(
            "value_and_grad: autograd differentiates NumPy arrays only, and these variables "
            "live on a GPU; use backend='jax' (pip install 'mpidist[jax]' plus a CUDA build "
            "of jaxlib).")
    _require(backend)
    return backend


def _require(backend: str) -> None:
    try:
        jax_module() if backend == "jax" else __import__(backend)
    except ImportError as err:
        raise ImportError(
            f"value_and_grad(backend={backend!r}) needs the {backend} package, which is not "
            f"installed: pip install 'mpidist[{_EXTRA[backend]}]'.") from err


def _loss_and_aux(out: Any, has_aux: bool) -> Any:
    """The loss function's ``out`` as ``(loss, aux)`` (aux None without ``has_aux``)."""
    if not has_aux:
        if isinstance(out, (tuple, list)):
            raise ValueError(
                f"value_and_grad: the loss function returned a {type(out).__name__} of "
                f"{len(out)} values, not a scalar; if the first is the loss and the rest are "
                "auxiliary outputs, pass has_aux=True (and return (loss, aux)): value_and_grad "
                "then returns ((loss, aux), gradients).")
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"value_and_grad(has_aux=True): the loss function must return (loss, "
                         f"aux), got {short_repr(out)}; return a tuple of two, or the loss "
                         "alone without has_aux (put several extra outputs in one aux value, a "
                         "tuple or dict).")
    return out


def _check_scalar(loss: Any, kind: str) -> None:
    shape = getattr(loss, "shape", None)
    real = isinstance(loss, numbers.Real) or (
        shape is not None and getattr(loss, "dtype", None) is not None
        and np.dtype(loss.dtype).kind in "fiu")
    if not real or (shape is not None and tuple(shape) != ()) and int(np.prod(shape)) != 1:
        what = f"shape {tuple(shape)}" if shape is not None else type(loss).__name__
        raise ValueError(
            f"value_and_grad: the loss function must return a real scalar, got a value of "
            f"{what} ({kind}); reduce it first, e.g. with "
            "mpidist.nn.compute_average_loss(per_example_loss, global_batch_size=...).")


# first variable -> {(loss code, ids of the variables)} already checked for unused variables:
# the check runs once for each (weak keys: a model that is gone takes its entries with it, and
# a new model that reuses its ids is checked afresh)
_CHECKED: "weakref.WeakKeyDictionary[Variable, set[tuple[Any, tuple[int, ...]]]]" = (
    weakref.WeakKeyDictionary())


def _first_time(fn: Any, variables: Sequence[Variable]) -> bool:
    """Whether ``fn`` is differentiated for the first time with respect to ``variables`` (the
    unused-variable check runs then: it is a property of the loss's code, not of a step)."""
    loss = getattr(fn, "__wrapped__", fn)  # a decorated loss, or minimize's: the user's own
    key = (getattr(loss, "__code__", loss), tuple(id(v) for v in variables))
    seen = _CHECKED.setdefault(variables[0], set())
    if key in seen:
        return False
    if len(seen) >= 64:
        seen.clear()
    seen.add(key)
    return True


def _warn_unused(variables: Any, unused: Any, reads: Any, caller: str = "value_and_grad"
                 ) -> None:
    """The UnusedVariableWarning for the variables at positions ``unused`` and for those of
    ``variables`` the loss read directly (``reads``, from ``record_direct_reads``), pointing
    at the line that called value_and_grad (or minimize, ``caller``)."""
    mine = {id(v) for v in variables}
    read = list(dict.fromkeys(v.name for v in reads if id(v) in mine))
    if not (unused or read):
        return
    names = [variables[i].name for i in unused]
    # _warn_unused < _differentiate < value_and_grad < its argument check < the caller, or
    # ... < gradients_for_minimize < minimize < its argument check < the caller
    level = 5 if caller == "value_and_grad" else 6
    if caller == "value_and_grad" or read:  # (minimize's loss(params) read a variable)
        text = unused_message(names, read)
        warnings.warn(f"{caller}:" + text.removeprefix("value_and_grad:"),
                      UnusedVariableWarning, stacklevel=level)
    else:  # minimize's loss(): it reads the variables themselves (a constant read raised)
        warnings.warn(
            f"{caller}: the loss does not depend on variable(s) "
            f"{', '.join(map(repr, names))}: they get no gradient and are not updated (TF: "
            "\"Gradients do not exist for variables ... when minimizing the loss\"). Leave them "
            "out of var_list, or check that the loss uses them.",
            UnusedVariableWarning, stacklevel=level)


def _like(grad: Any, param: Any) -> Any:
    """``grad`` as a writable array of ``param``'s kind and dtype (a backend may widen the
    dtype, give a 0-d gradient as a scalar, or, as JAX does, lend a read-only view of its
    own buffer, which in-place gradient code such as clipping could not write)."""
    if array_module(param) is np:
        grad = np.asarray(grad, dtype=param.dtype)
        return grad if grad.flags.writeable else grad.copy()
    return grad if grad.dtype == param.dtype else grad.astype(param.dtype)


# -- autograd ----------------------------------------------------------------------------------
def _with_autograd(loss_of: Any, structured: Any, single: Any, params: Any, check: bool = False
                   ) -> tuple[Any, Any, list[Any], Sequence[int]]:
    """``(loss, aux, gradients, unused)``: ``unused`` lists the positions of the variables the
    backward pass never reached (only when ``check``)."""
    import autograd  # noqa: PLC0415 - an optional extra
    from autograd.tracer import getval  # noqa: PLC0415

    holder: dict[str, Any] = {}
    count = len(params)
    reached: set[int] = set()
    tap = _autograd_tap() if check else None

    def scalar(boxed: Any) -> Any:
        # One box per variable, taken from the list's box; when checking, each passes through
        # an identity whose backward step records that the gradient reached it.
        elements = [boxed[i] if tap is None else tap(boxed[i], i, reached) for i in range(count)]
        p = elements[0] if single else \
            (tuple(elements) if isinstance(structured, tuple) else elements)
        loss, aux = loss_of(p)
        _check_scalar(getval(loss), "autograd")
        holder["aux"] = aux
        return loss

    vjp, loss = autograd.make_vjp(scalar)(list(params))
    grads = list(vjp(np.ones_like(getval(loss))))
    unused = [i for i in range(count) if i not in reached] if check else ()
    aux = _map_leaves(getval, holder.get("aux"))
    loss = np.asarray(getval(loss)).reshape(())
    return loss, aux, grads, unused


@functools.cache
def _autograd_tap() -> Any:
    """``tap(x, i, reached)``: ``x`` itself, as an autograd primitive whose backward step adds
    ``i`` to ``reached``. autograd runs the backward step of exactly the operations the loss
    was computed from, so a variable whose tap never runs does not enter the loss."""
    from autograd.extend import defvjp, primitive  # noqa: PLC0415 - an optional extra

    def tap(x: Any, i: Any, reached: Any) -> Any:
        return x

    # primitive(tap), not @primitive: autograd is untyped, and the primitive is not tap's type.
    tapped: Any = primitive(tap)

    def tap_vjp(ans: Any, x: Any, i: Any, reached: Any) -> Any:
        def vjp(g: Any) -> Any:
            reached.add(i)
            return g
        return vjp

    defvjp(tapped, tap_vjp)
    return tapped


@functools.cache
def _autograd_sees_traced_variables() -> None:
    """Let autograd's functions take a variable inside ``traced_reads`` for its traced value
    (minimize's ``loss()``, as TF's tape watches variables): ``anp.sum(w)``, ``anp.dot(x, w)``
    and ``h + b`` with ``h`` traced (autograd's ``h.__add__(b)`` is ``anp.add(h, b)``) would
    otherwise read ``w`` / ``b`` as a constant. Every autograd primitive finds its traced
    arguments through ``autograd.tracer.find_top_boxed_args(args)``; this wraps it to hand it
    the traced values first (``with_traced_values``: the arguments themselves on any thread
    not inside ``traced_reads``). Where autograd has no such function, nothing is wrapped and a
    constant read stays the TypeError ``traced_reads`` raises."""
    try:
        from autograd import tracer  # noqa: PLC0415 - an optional extra
    except ImportError:
        return
    find = getattr(tracer, "find_top_boxed_args", None)
    if not callable(find) or getattr(find, "__mpidist_wrapped__", False):
        return

    def find_top_boxed_args(args: Any) -> Any:
        return find(with_traced_values(args))

    find_top_boxed_args.__mpidist_wrapped__ = True  # type: ignore[attr-defined]
    tracer.find_top_boxed_args = find_top_boxed_args


# -- JAX ----------------------------------------------------------------------------------------
# Settings of JAX's GPU memory that a user may have chosen; with none set, JAX would reserve
# 75% of each GPU it initialises, leaving CuPy (the variables, the batches) the rest.
_JAX_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                         "XLA_PYTHON_CLIENT_ALLOCATOR")


def jax_module() -> Any:
    """The jax module, with JAX's GPU memory allocated on demand unless the user set one of
    ``_JAX_MEMORY_VARIABLES`` (read when JAX first creates its GPU backend, so this works as
    long as the program has not run a JAX computation on the GPU yet)."""
    if not any(name in os.environ for name in _JAX_MEMORY_VARIABLES):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax  # noqa: PLC0415 - an optional extra

    return jax


def _jax_leaves(tree: Any) -> Any:
    """``tree`` (the loss function's extra arguments) with every CuPy array as a JAX array
    on the same GPU, through DLPack (no copy); other leaves as they are."""
    if "cupy" not in sys.modules:  # no CuPy array can exist
        return tree
    jax = jax_module()
    return jax.tree_util.tree_map(
        lambda x: jax.dlpack.from_dlpack(x) if cupy_backend.is_cupy_array(x) else x, tree)


def _with_jax(loss_of: Any, structured: Any, single: Any, params: Any, compiled: Any = None,
              args: Any = (), check: bool = False) -> tuple[Any, Any, list[Any], Sequence[int]]:
    """JAX's value and gradient; with ``compiled`` (``_compiled``'s function), that compiled
    function of ``(params, *args)`` instead of tracing ``loss_of`` again. ``unused`` as in
    ``_with_autograd``."""
    jax = jax_module()
    on_gpu = array_module(params[0]) is not np
    if any(np.dtype(p.dtype) == np.float64 for p in params) \
            and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "value_and_grad(backend='jax'): these variables are float64 but JAX computes in "
            "float32 unless 64-bit mode is on; call jax.config.update('jax_enable_x64', True) "
            "at the start of the program, or create the variables as float32.")
    # NumPy arrays go in as they are (JAX converts them at its boundary, in C++ under jit);
    # CuPy arrays through DLPack, without a copy.
    inputs = jax.tree_util.tree_map(jax.dlpack.from_dlpack, structured) if on_gpu \
        else structured

    if compiled is not None:
        (loss, aux), grads = compiled(inputs, *args)
    else:
        def scalar(p: Any) -> Any:
            loss, aux = loss_of(p)
            _check_scalar(loss, "jax")
            return loss, aux

        (loss, aux), grads = jax.value_and_grad(scalar, has_aux=True)(inputs)
    grads = [grads] if single else list(grads)
    unused: Sequence[int] = ()
    if check:
        zero = [i for i, g in enumerate(grads) if not bool(jax.numpy.any(g))]
        unused = _unused_inputs(lambda p: loss_of(p)[0], inputs, zero) if zero else ()
    back = _from_jax_gpu if on_gpu else _host_copy
    return (back(loss).reshape(()), jax.tree_util.tree_map(back, aux),
            [back(g) for g in grads], unused)


def _unused_inputs(scalar: Any, inputs: Any, candidates: Any) -> list[int]:
    """Those of ``candidates`` (positions of ``inputs``' leaves) that ``scalar``'s jaxpr does
    not use to compute its output."""
    jax = jax_module()

    jaxpr = jax.make_jaxpr(scalar)(inputs).jaxpr
    used = _used_inputs(jaxpr, [True] * len(jaxpr.outvars))
    return [i for i in candidates if not used[i]]


def _used_inputs(jaxpr: Any, wanted: Any) -> list[bool]:
    """For each input of ``jaxpr``, whether the outputs flagged in ``wanted`` depend on it: a
    walk of the equations from the outputs back, into the jaxpr of a call (a nested jit) where
    it has one, else taking all of an equation's inputs as used."""
    def variables(atoms: Any, flags: Any = None) -> list[Any]:
        return [a for i, a in enumerate(atoms) if type(a).__name__ != "Literal"
                and (flags is None or flags[i])]

    needed = set(variables(jaxpr.outvars, wanted))
    for eqn in reversed(jaxpr.eqns):
        outs = [o in needed for o in eqn.outvars]
        if not any(outs):
            continue
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's own jaxpr
        if hasattr(inner, "eqns") and len(inner.invars) == len(eqn.invars) \
                and len(inner.outvars) == len(eqn.outvars):
            needed.update(variables(eqn.invars, _used_inputs(inner, outs)))
        else:
            needed.update(variables(eqn.invars))
    return [v in needed for v in jaxpr.invars]


def _host_copy(x: Any) -> Any:
    """A writable NumPy array of a JAX result (``np.asarray`` alone lends JAX's read-only
    buffer)."""
    out = np.asarray(x)
    return out if out.flags.writeable else out.copy()


# (fn, has_aux) -> jax.jit(value_and_grad(...)); jax.jit caches per shape
_COMPILED: dict[tuple[object, bool], object] = {}


def _compiled(fn: Any, has_aux: bool) -> Any:
    """The compiled value-and-gradient of ``fn`` (one per loss function; a program has a
    few, the bound keeps a program that makes new closures every step from growing it)."""
    key = (fn, has_aux)
    compiled = _COMPILED.get(key)
    if compiled is None:
        jax = jax_module()

        def scalar(p: Any, *args: Any) -> Any:
            loss, aux = _loss_and_aux(fn(p, *args), has_aux)
            _check_scalar(loss, "jax")
            return loss, aux

        if len(_COMPILED) >= 64:
            _COMPILED.clear()
        compiled = _COMPILED[key] = jax.jit(jax.value_and_grad(scalar, has_aux=True))
    return compiled


def _from_jax_gpu(x: Any) -> Any:
    cupy: Any = sys.modules.get("cupy")  # imported: x came from a CuPy array
    return cupy.from_dlpack(x)


def _map_leaves(fn: Any, tree: Any) -> Any:
    if isinstance(tree, (list, tuple)):
        mapped = [_map_leaves(fn, t) for t in tree]
        return mapped if isinstance(tree, list) else type(tree)(mapped) \
            if not hasattr(tree, "_fields") else type(tree)(*mapped)
    if isinstance(tree, dict):
        return {k: _map_leaves(fn, v) for k, v in tree.items()}
    return fn(tree) if traced_kind(tree) is not None else tree


# -- models that define only their loss (fit / evaluate) ----------------------------------------
def model_loss_and_gradients(model: Any, x: Any, y: Any, backend: str | None = None
                             ) -> tuple[Any, ...]:
    """``loss_and_gradients(x, y)`` for a model that defines only ``loss(params, x, y)``:
    ``(per_example_loss, gradients[, predictions])``, the gradients being those of the
    per-example losses' sum, from ``backend`` (see ``value_and_grad``).

    ``model.loss`` receives the trainable variables' values (traced) in their order and
    returns the per-example losses, or ``(per_example_losses, predictions)``."""
    variables = list(model.trainable_variables)

    # x, y as arguments: value_and_grad hands them to the backend
    def total(params: Any, x: Any, y: Any) -> Any:
        per_example, predictions = _split_loss_output(model.loss(params, x, y), y)
        xp = namespace_of(per_example) or array_module(per_example)
        return xp.sum(per_example), (per_example, predictions)

    (_, (per_example, predictions)), grads = value_and_grad(total, variables, x, y,
                                                            has_aux=True, backend=backend)
    return (per_example, grads) if predictions is None else (per_example, grads, predictions)


def model_per_example_loss(model: Any, x: Any, y: Any, backend: str | None = None
                           ) -> tuple[Any, Any]:
    """``(per_example_losses, predictions or None)`` of a model that defines only
    ``loss(params, x, y)``, computed on the variables' current values without tracing
    (``evaluate``), as arrays of the variables' kind. ``backend`` as in ``value_and_grad``:
    JAX gets its own arrays (from GPU variables through DLPack, without a copy)."""
    params = [v.current_array() for v in model.trainable_variables]
    name = _backend_for(backend, params)
    on_gpu = array_module(params[0]) is not np
    if name == "jax":
        params, x, y = _jax_leaves((params, x, y))
    per_example, predictions = _split_loss_output(model.loss(params, x, y), y)
    back = _from_jax_gpu if on_gpu and name == "jax" else np.asarray
    return back(per_example), None if predictions is None else back(predictions)


def _split_loss_output(out: Any, y: Any) -> tuple[Any, Any]:
    per_example, predictions = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if getattr(per_example, "ndim", 0) < 1:
        got = "a scalar" if getattr(per_example, "ndim", None) == 0 or np.isscalar(per_example) \
            else short_repr(per_example)
        unbatched = np.ndim(y) == 0 if not isinstance(y, (tuple, list, dict)) else False
        hint = (" Here y is a single label (no batch dimension): the dataset yields single "
                "examples, so batch it first, e.g. dataset.batch(GLOBAL_BATCH_SIZE)."
                if unbatched else "")
        raise ValueError(
            f"model.loss(params, x, y) must return the per-example losses (one per example of "
            f"the batch, shape (batch,)) or (per_example_losses, predictions); got {got}. fit "
            f"sums them over the global batch itself.{hint}")
    check_per_example(per_example, y, "model.loss(params, x, y)")
    return per_example, predictions

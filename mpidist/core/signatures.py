"""One check of public arguments, from declarations (issue 22, item 2).

``@accepts(...)`` on a public function, method or constructor checks its arguments at entry
against what is declared: the function's own type hints, plus declarations given to the
decorator (``@accepts(learning_rate=Annotated[float, NonNegative()] | Callable)``), which take
precedence and are merged into ``__annotations__`` so ``help()`` shows them. Value constraints
that types cannot say ride in ``typing.Annotated`` (``Positive()``, ``NonNegative()``,
``InRange(lo, hi)``, ``NonEmpty()``, ``OneOf(...)``) and known confusions in ``Confusion``.
A callable argument is declared by the calls its receiver makes of it (``CallShapes``:
"called as f() or f(step)"), checked against the callable's own signature when it is handed
over, not at its first call (``check_callable``).

The declarations are read once, on the first call (so hints may name classes of higher layers,
as strings, without import cycles), and compiled into one predicate per argument: a call costs a
loop over the declared arguments and an ``isinstance`` each (well under a microsecond for the
usual one to three arguments). Only a failing call pays for the message, which names the call,
the argument, the value received (type; shape and dtype for arrays), what is accepted and, where
a common confusion is recognised, the fix (a class where an instance is expected, a method where
its value, a string where a number, one object where a list). A wrong type is a TypeError; a
right type with a wrong value is ``InvalidArgumentError`` (a ValueError). Nothing has run yet
when either is raised, so the call leaves every state as it was.

Hints the checker cannot test at run time (TypeVars, non-runtime Protocols, unknown generics)
accept every value: a declaration never rejects what the function's body would accept.
"""

import collections.abc
import functools
import importlib
import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import numpy as np

from mpidist.core.messages import short_repr
from mpidist.errors import InvalidArgumentError

__all__ = ["accepts", "Positive", "NonNegative", "InRange", "NonEmpty", "OneOf", "Confusion",
           "ArrayLike", "Number", "DType", "DTypeStructure", "describe_value",
           "checked_callables", "check_call", "CallShapes", "check_callable",
           "positional_arguments"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_checked: list[Callable[..., Any]] = []


def checked_callables() -> tuple[Callable[..., Any], ...]:
    """Every function decorated with ``accepts`` so far (the API walk's coverage report)."""
    return tuple(_checked)


# -- value constraints (ride in typing.Annotated) -----------------------------------------------
class Constraint:
    """A condition on a value whose type already passed; ``text`` says what is accepted."""

    text = ""

    def ok(self, value: Any) -> bool:
        raise NotImplementedError


class Positive(Constraint):
    text = "> 0 and finite"

    def ok(self, value: Any) -> bool:
        return bool(value > 0) and math.isfinite(value)


class NonNegative(Constraint):
    text = ">= 0 and finite"

    def ok(self, value: Any) -> bool:
        return bool(value >= 0) and math.isfinite(value)


class InRange(Constraint):
    """``lo <= value <= hi`` (``lo < value`` when ``open_low``)."""

    def __init__(self, lo: float, hi: float, open_low: bool = False) -> None:
        self.lo, self.hi, self.open_low = lo, hi, open_low
        self.text = f"in {'(' if open_low else '['}{lo}, {hi}]"

    def ok(self, value: Any) -> bool:
        above = value > self.lo if self.open_low else value >= self.lo
        return bool(above and value <= self.hi)


class NonEmpty(Constraint):
    text = "not empty"

    def ok(self, value: Any) -> bool:
        return len(value) > 0


class OneOf(Constraint):
    def __init__(self, *choices: Any) -> None:
        self.choices = choices
        self.text = "one of " + ", ".join(repr(c) for c in choices)

    def ok(self, value: Any) -> bool:
        try:
            return value in self.choices
        except (TypeError, ValueError):  # an array compared with the choices
            return False


class Confusion:
    """A known mistake for one argument: when ``applies(value)``, the message adds ``fix`` (a
    text, or a function of the value that writes it)."""

    def __init__(self, applies: Callable[[Any], bool], fix: str | Callable[[Any], str]) -> None:
        self.applies, self.fix = applies, fix

    def text_for(self, value: Any) -> str:
        return self.fix(value) if callable(self.fix) else self.fix


class _ArrayLike:
    """Marker: a number, an array (NumPy, CuPy, anything with ``__array__``), a distributed
    value, or a (nested) list/tuple of numbers; never a string, None, a class or a method."""


ArrayLike = _ArrayLike
"""Declares an array argument (see ``_ArrayLike``)."""

class _DType:
    """Marker: what ``numpy.dtype`` accepts as one dtype: a ``np.dtype``, a NumPy or Python
    scalar type (``np.float32``, ``float``) or a dtype name (``"float32"``, ``"int64"``); never a
    structured-dtype list or dict, a number, or a class that is not a scalar type."""


class _DTypeStructure:
    """Marker: a ``DType`` or a (nested) tuple, list or dict of them (``output_types``)."""


DType = _DType
"""Declares a dtype argument (see ``_DType``); ``DType | None`` where None means a default."""

DTypeStructure = _DTypeStructure
"""Declares a structure of dtypes (see ``_DTypeStructure``)."""

Number = typing.Annotated[float, "number"]
"""A real number (int, float, NumPy scalar), not a bool and not a string."""


# -- compiling a declaration into a predicate ---------------------------------------------------
class _Check:
    """A compiled declaration: ``ok`` tests a value; ``text`` says what is accepted."""

    __slots__ = ("ok", "type_ok", "text", "types", "constraints", "confusions", "element",
                 "takes_callables")

    def __init__(self, ok: Callable[[Any], bool], text: str, types_: tuple[type, ...] = (),
                 element: "_Check | None" = None) -> None:
        self.ok, self.text, self.types, self.element = ok, text, types_, element
        self.type_ok = ok  # ``ok`` without the value constraints: which error type to raise
        self.constraints: list[Constraint] = []
        self.confusions: list[Confusion] = []
        # a callable is what this argument takes: "call it, f()" is then no fix to suggest
        self.takes_callables = False


def _accept_all(value: Any) -> bool:
    return True


_ANY = _Check(_accept_all, "any value")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    t = type(v)
    if t is float or t is int:
        return True
    if t is str:
        return False
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return type(v) is bool or type(v).__name__ == "bool_"


def _is_array_like(v: Any) -> bool:
    t = type(v)
    if t is float or t is int:
        return True
    if hasattr(t, "__array__") and t is not type:  # NumPy/CuPy arrays and scalars, variables
        return True
    if isinstance(v, (str, bytes, type, types.MethodType, types.FunctionType,
                      collections.abc.Mapping, collections.abc.Set)) or v is None:
        return False
    if isinstance(v, (list, tuple)):
        return all(_is_array_like(x) for x in v)
    if isinstance(v, (numbers.Number, bool)):
        return True
    return (hasattr(v, "__array__") or hasattr(v, "__cuda_array_interface__")
            or hasattr(v, "values") or hasattr(v, "dtype"))


def _is_dtype(v: Any) -> bool:
    if isinstance(v, np.dtype):
        return True
    if isinstance(v, type):
        # np.dtype(AnyClass) is the object dtype: only scalar types (and object) are dtypes
        return issubclass(v, (np.generic, int, float, complex, bool, str, bytes)) or v is object
    if isinstance(v, str):
        try:
            np.dtype(v)
        except (TypeError, ValueError):
            return False
        return True
    return False


def _is_dtype_structure(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_is_dtype_structure(x) for x in v)
    if isinstance(v, dict):
        return all(_is_dtype_structure(x) for x in v.values())
    return _is_dtype(v)


_DTYPE_TEXT = "a NumPy dtype (e.g. np.float32 or 'float32')"
_DTYPE_FIX = Confusion(lambda v: isinstance(v, str),
                       "use a NumPy dtype name such as 'float32', 'float64' or 'int64'")

_SCALARS: dict[type, _Check] = {
    int: _Check(_is_int, "an int", (int,)),
    float: _Check(_is_real, "a number", (float, int)),
    bool: _Check(_is_bool, "True or False", (bool,)),
    str: _Check(lambda v: isinstance(v, str), "a string", (str,)),
}


# -- callables, by the calls made of them ---------------------------------------------------------
def positional_arguments(fn: Any) -> tuple[int, float, tuple[str, ...]] | None:
    """``(required, most, keyword_only)`` of ``fn``'s signature: how many positional arguments
    it needs and takes at most (``inf`` with ``*args``), and its keyword-only arguments without
    a default (a positional call cannot fill them). Functions, lambdas, partials, builtins,
    bound methods and objects with ``__call__`` alike (``inspect.signature``); None where no
    signature can be read."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a text signature, an odd object
        return None
    required, most, keyword_only = 0, 0.0, []
    for p in parameters:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            required += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            most = math.inf
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            keyword_only.append(p.name)
    return required, most, tuple(keyword_only)


class CallShapes:
    """Declares a callable argument by the calls its receiver makes of it (a role).

    ``calls`` maps each number of positional arguments the callable may be called with to how
    that call reads, in order of preference: a learning-rate schedule is
    ``CallShapes("a learning-rate schedule", {0: "f()", 1: "f(step)"}, example=...)``. A
    callable fits when its signature takes one of those calls; ``arity`` says which one (the
    first that fits: ``def f(step=0)`` is called as ``f()``). A class never fits (a role calls
    a function, not a constructor), nor does a callable that needs a keyword-only argument.
    Where the signature cannot be read, ``unknown`` calls is assumed (the first by default).
    ``also`` names what else the argument accepts, for the message (``"a number"``).

    Used as a hint in ``accepts`` (``@accepts(fn=ROLE)``; in a union, spelled
    ``Annotated[Callable, ROLE]``, e.g. ``list[Variable] | Annotated[Callable, ROLE]``) or
    directly through ``check_callable``; both raise the same TypeError, naming the callable's
    signature, the calls accepted and ``example``.
    """

    def __init__(self, role: str, calls: dict[int, str], example: str,
                 unknown: int | None = None, also: str | None = None) -> None:
        self.role, self.calls, self.example = role, dict(calls), example
        self.unknown = next(iter(self.calls)) if unknown is None else unknown
        self.text = (f"{also}, or " if also else "") + (
            f"{role}: a callable called as " + " or ".join(self.calls.values()))
        self._check: _Check | None = None

    def arity(self, fn: Any) -> int | None:
        """How many positional arguments to call ``fn`` with, or None where it fits no call."""
        if isinstance(fn, type) or not callable(fn):
            return None
        taken = positional_arguments(fn)
        if taken is None:
            return self.unknown
        required, most, keyword_only = taken
        if keyword_only:
            return None
        for n in self.calls:
            if required <= n <= most:
                return n
        return None

    def misfit(self, fn: Any) -> str:
        """Why ``fn`` fits no call, and the fix (the TypeError's last sentence)."""
        counts = " or ".join(map(str, self.calls))
        if isinstance(fn, type):
            return (f"pass an instance, {fn.__qualname__}(...), or a function: {self.role} "
                    f"is called as {' or '.join(self.calls.values())}, e.g. {self.example}")
        if not callable(fn):
            return f"pass e.g. {self.example}"
        taken = positional_arguments(fn)
        try:
            signature = str(inspect.signature(fn))
        except (TypeError, ValueError):
            signature = "(...)"
        if taken is not None and taken[2]:
            why = f"needs the keyword-only argument(s) {', '.join(taken[2])}"
        elif taken is not None and taken[0] > max(self.calls):
            why = f"needs {taken[0]} positional argument(s)"
        else:
            why = f"takes at most {taken[1]:g} positional argument(s)" if taken else \
                "cannot be called so"
        return (f"its signature {signature} {why}, and {self.role} is called with {counts}: "
                f"write it as e.g. {self.example}")

    def compiled(self) -> "_Check":
        """The predicate ``accepts`` uses for this hint (built once)."""
        if self._check is None:
            check = _Check(lambda v: self.arity(v) is not None, self.text)
            check.confusions = [Confusion(_accept_all, self.misfit)]
            check.takes_callables = True
            self._check = check
        return self._check


def check_callable(fn: Any, shapes: CallShapes, where: str, argument: str) -> int:
    """The number of positional arguments to call ``fn`` with in the role ``shapes`` declares;
    else the TypeError ``accepts`` raises for that hint, naming ``where`` (the call, e.g.
    ``"SGD"``), ``argument``, ``fn``'s signature and the calls accepted. For an argument
    checked in a function's body (one that also takes non-callables, or is set later as an
    attribute), at the moment it is handed over."""
    arity = shapes.arity(fn)
    if arity is None:
        _fail(where, argument, shapes.compiled(), fn)
    return arity  # type: ignore[return-value]  # _fail raised where it is None


def _resolve(hint: Any, globalns: dict[str, Any]) -> Any:
    if isinstance(hint, str):
        if "|" in hint and ":" in hint:  # "package.module:Name | None"
            parts = [_resolve(part.strip(), globalns) for part in hint.split("|")]
            return typing.Union[tuple(parts)]
        if hint.strip() == "None":
            return None
        if ":" in hint:  # "package.module:Name": a class of a higher layer
            module, _, name = hint.partition(":")
            return getattr(importlib.import_module(module), name)
        try:
            return eval(hint, globalns)
        except Exception:  # noqa: BLE001 - an unresolvable hint checks nothing
            return Any
    if isinstance(hint, typing.ForwardRef):
        return _resolve(hint.__forward_arg__, globalns)
    return hint


def _class_text(cls: type) -> str:
    module = cls.__module__
    if module.startswith("mpidist"):
        public = "mpidist" if module.startswith(("mpidist.strategies", "mpidist.values")) else module
        return f"a {public}.{cls.__qualname__}" if public == "mpidist" else f"a {cls.__qualname__}"
    if module == "builtins":
        return f"a {cls.__qualname__}"
    return f"a {module}.{cls.__qualname__}"


def _compile(hint: Any, globalns: dict[str, Any]) -> _Check:
    hint = _resolve(hint, globalns)
    if hint is Any or hint is object or hint is inspect.Parameter.empty:
        return _ANY
    if isinstance(hint, CallShapes):
        return hint.compiled()
    if hint is None or hint is type(None):
        return _Check(lambda v: v is None, "None", (type(None),))
    if hint is _ArrayLike:
        return _Check(_is_array_like, "an array or a number (or a nested list of numbers)")
    if hint is _DType or hint is _DTypeStructure:
        check = _Check(_is_dtype, _DTYPE_TEXT) if hint is _DType else _Check(
            _is_dtype_structure, _DTYPE_TEXT + " or a (nested) tuple/dict of them")
        check.confusions = [_DTYPE_FIX]
        return check
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        shapes = next((a for a in args[1:] if isinstance(a, CallShapes)), None)
        if shapes is not None:  # Annotated[Callable, ROLE]: the role's check
            return shapes.compiled()
        inner = _compile(args[0], globalns)
        if "number" in args[1:]:
            inner = _SCALARS[float]
        check = _Check(inner.ok, inner.text, inner.types, inner.element)
        check.constraints = [a for a in args[1:] if isinstance(a, Constraint)]
        check.confusions = [a for a in args[1:] if isinstance(a, Confusion)]
        if check.constraints:
            check.text += " " + " and ".join(c.text for c in check.constraints)
        return check
    if origin is typing.Union or origin is types.UnionType:
        parts = [_compile(a, globalns) for a in args]
        if any(p is _ANY for p in parts):
            return _ANY
        oks = tuple(p.ok for p in parts)
        plain = all(p.types and not p.constraints
                    and getattr(p.ok, "__wrapped__", None) is _isinstance_ok for p in parts)
        if plain:  # one isinstance with a tuple of classes
            classes = tuple(t for p in parts for t in p.types)
            check = _Check(lambda v: isinstance(v, classes), "", classes)
            check.ok = _bind_isinstance(classes)
        else:
            ok = _any_of(oks)
            check = _Check(ok, "", tuple(t for p in parts for t in p.types))
        check.text = " or ".join(p.text for p in parts)
        check.confusions = [c for p in parts for c in p.confusions]
        check.takes_callables = any(p.takes_callables for p in parts)
        # constraints of a member hold for that member only: kept inside its predicate
        if any(p.constraints for p in parts):
            check.type_ok = check.ok
            check.ok = _any_of(tuple(_with_constraints(p) for p in parts))
            check.constraints = []
        check.element = next((p.element for p in parts if p.element is not None), None)
        return check
    if origin is typing.Literal:
        choices = args
        return _Check(OneOf(*choices).ok, "one of " + ", ".join(repr(c) for c in choices))
    if origin is type:
        base = _resolve(args[0], globalns) if args else object
        if not isinstance(base, type):
            return _Check(lambda v: isinstance(v, type), "a class")
        return _Check(lambda v: isinstance(v, type) and issubclass(v, base),
                      f"a subclass of {base.__qualname__}")
    if hint is collections.abc.Callable or origin is collections.abc.Callable:
        check = _Check(callable, "a callable")
        check.takes_callables = True
        return check
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable,
                  collections.abc.Collection, set, frozenset):
        element = _compile(args[0], globalns) if args and args[0] is not Ellipsis else _ANY
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            element = _compile(args[0], globalns)
        elif origin is tuple and args and Ellipsis not in args:
            element = _ANY  # fixed-length tuples: the body checks the items
        return _sequence_check(origin, element)
    if origin in (dict, collections.abc.Mapping):
        return _Check(_bind_isinstance((collections.abc.Mapping,)), "a dict",
                      (dict,))
    if hint in (collections.abc.Iterable, collections.abc.Collection, collections.abc.Sequence):
        return _sequence_check(hint, _ANY)  # the bare ABCs: a str or a 0-d array is no list
    if isinstance(hint, type):
        if typing.Protocol in getattr(hint, "__mro__", ()) and not _runtime_checkable(hint):
            return _ANY
        if hint in (list, tuple):
            return _sequence_check(hint, _ANY)
        if hint is dict:
            return _Check(_bind_isinstance((collections.abc.Mapping,)), "a dict", (dict,))
        return _Check(_bind_isinstance((hint,)), _class_text(hint), (hint,))
    return _ANY  # TypeVar, ParamSpec, a generic this checker does not know: no check


def _runtime_checkable(cls: type) -> bool:
    try:
        isinstance(None, cls)
    except TypeError:  # a Protocol not marked @runtime_checkable
        return False
    return True


def _any_of(oks: tuple[Callable[[Any], bool], ...]) -> Callable[[Any], bool]:
    """One predicate from several, without a generator per call (this runs on every call)."""
    if len(oks) == 2:
        first, second = oks
        return lambda v: first(v) or second(v)
    if len(oks) == 3:
        first, second, third = oks
        return lambda v: first(v) or second(v) or third(v)

    def ok(v: Any) -> bool:
        for one in oks:  # noqa: SIM110 - a loop is cheaper than any() over a generator
            if one(v):
                return True
        return False
    return ok


def _isinstance_ok(v: Any) -> bool:  # the marker of predicates built by _bind_isinstance
    return True


def _bind_isinstance(classes: tuple[type, ...]) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        return isinstance(v, classes)
    ok.__wrapped__ = _isinstance_ok  # type: ignore[attr-defined]
    return ok


def _with_constraints(check: _Check) -> Callable[[Any], bool]:
    if not check.constraints:
        return check.ok
    base, constraints = check.ok, check.constraints
    if len(constraints) == 1:
        only = constraints[0]
        return lambda v: base(v) and _holds(only, v)
    return lambda v: base(v) and all(_holds(c, v) for c in constraints)


def _holds(constraint: Constraint, value: Any) -> bool:
    try:
        return constraint.ok(value)
    except (TypeError, ValueError):
        return False


def _sequence_check(origin: Any, element: _Check) -> _Check:
    kinds: tuple[type, ...] = (list, tuple)
    if origin in (collections.abc.Iterable, collections.abc.Collection):
        def ok(v: Any) -> bool:
            t = type(v)
            if t is list or t is tuple:  # the usual case first: no ABC lookup
                return element is _ANY or all(element.ok(x) for x in v)
            if isinstance(v, (str, bytes, type)) or not isinstance(v, collections.abc.Iterable) \
                    or getattr(v, "ndim", 1) == 0:  # a 0-d array is Iterable but not iterable
                return False
            if element is _ANY:
                return True
            if isinstance(v, np.ndarray):  # its items, without consuming anything
                return v.size == 0 or (all(element.ok(x) for x in v) if v.dtype == object
                                       else element.ok(v.flat[0]))
            if isinstance(v, (collections.abc.Set, collections.abc.Mapping)):
                return all(element.ok(x) for x in v)  # a dict iterates over its keys
            return not isinstance(v, (list, tuple)) or all(element.ok(x) for x in v)
        text = "an iterable"
    else:
        if origin in (set, frozenset):
            kinds = (set, frozenset, list, tuple)
        elif origin is collections.abc.Sequence:
            kinds = (collections.abc.Sequence,)

        def ok(v: Any) -> bool:
            if not isinstance(v, kinds) or isinstance(v, (str, bytes)):
                return False
            if element is _ANY:
                return True
            return all(element.ok(x) for x in typing.cast(collections.abc.Iterable[Any], v))
        text = "a list or tuple"
    if element is not _ANY:
        text += f" of {_plural(element.text)}"
    return _Check(ok, text, kinds, element)


def _plural(text: str) -> str:
    return text[2:] + "s" if text.startswith("a ") and " " not in text[2:] else text


# -- the message --------------------------------------------------------------------------------
def describe_value(value: Any) -> str:
    """What a message says the user passed: its type, and shape/dtype for arrays."""
    if isinstance(value, type):
        return f"the class {value.__qualname__} (a class, not an instance)"
    if inspect.ismethod(value):
        return f"the method {value.__qualname__} (a bound method, not its value)"
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return f"the function {getattr(value, '__qualname__', value)!s}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None and not isinstance(value, (int, float)):
        return f"{type(value).__name__} of shape {shape} and dtype {dtype}"
    if value is None:
        return "None"
    return f"{type(value).__name__} {short_repr(value)}"


def _fixes(check: _Check, value: Any) -> list[str]:
    fixes = [c.text_for(value) for c in check.confusions if _applies(c, value)]
    classes = tuple(t for t in check.types if isinstance(t, type) and t not in (type(None),))
    if isinstance(value, type) and classes and any(
            issubclass(value, t) for t in classes if t not in (int, float, bool, str)):
        fixes.append(f"pass an instance, e.g. {value.__qualname__}(...), not the class itself")
    elif (inspect.ismethod(value) or inspect.isfunction(value)) and not check.takes_callables:
        fixes.append(f"call it, {getattr(value, '__name__', 'f')}(), to pass its value "
                     "(a method or function was passed, not what it returns)")
    elif isinstance(value, str) and (set(classes) & {int, float}) and _parses(value):
        fixes.append(f"pass the number {value.strip()}, not the string {value!r}")
    elif check.element is not None and not isinstance(value, (list, tuple)) \
            and check.element.ok(value):
        fixes.append(f"pass a list, e.g. [{short_repr(value, 30)}], even for one item")
    elif check.element is not None and isinstance(value, (list, tuple)):
        bad = next((x for x in value if not check.element.ok(x)), None)
        if bad is not None or any(x is None for x in value):
            fixes.append(f"its item {describe_value(bad)} is not "
                         f"{check.element.text}"
                         + (f": pass an instance, {bad.__qualname__}()"
                            if isinstance(bad, type) else ""))
    return fixes


def _applies(confusion: Confusion, value: Any) -> bool:
    try:
        return bool(confusion.applies(value))
    except Exception:  # noqa: BLE001 - a confusion test never hides the real error
        return False


def _parses(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fail(where: str, name: str, check: _Check, value: Any) -> None:
    wrong_type = not check.type_ok(value)
    what = f"{where}: argument '{name}' got {describe_value(value)}; it accepts {check.text}."
    fixes = _fixes(check, value)
    if fixes:
        what += " Fix: " + "; ".join(fixes) + "."
    if wrong_type:
        raise TypeError(what)
    raise InvalidArgumentError(what)


# -- the decorator ------------------------------------------------------------------------------
def _where(fn: Callable[..., Any]) -> str:
    qualname = fn.__qualname__.replace(".<locals>", "")
    if qualname.endswith(".__init__"):
        return qualname[: -len(".__init__")]
    return qualname


class _Missing:
    """An argument the call did not pass (its default is not checked)."""

    def __repr__(self) -> str:
        return "<not passed>"


_MISSING = _Missing()


def _constructor_where(where: str) -> Callable[[Any], str]:
    """A constructor's message names the class the user called (a subclass inherits it)."""
    def where_of(self: Any) -> str:
        if self is _MISSING:
            return where
        return (self if isinstance(self, type) else type(self)).__qualname__
    return where_of


def _checker(fn: Callable[..., Any], params: list[inspect.Parameter],
             checks: dict[str, _Check], where: str) -> Callable[..., None]:
    """A function with ``fn``'s parameters, every default replaced by "not passed", that tests
    each declared argument: Python binds the call (in C) and each check is one ``if``, so a
    call costs its predicates and little else. Extra positional or keyword arguments are
    accepted here and left to ``fn`` to refuse with Python's own message."""
    names: dict[str, Any] = {"_M": _MISSING, "_fail": _fail}
    constructor = fn.__name__ == "__init__" and bool(params) and params[0].name == "self"
    names["_where"] = _constructor_where(where) if constructor else (lambda _: where)
    head: list[str] = []
    body: list[str] = []
    star = False
    for i, p in enumerate(params):
        if p.kind is p.VAR_KEYWORD:
            continue
        if p.kind is p.VAR_POSITIONAL:
            head.append(f"*{p.name}")
            star = True
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            head.append("*_acc_rest")
            star = True
        head.append(f"{p.name}=_M")
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params)
                                            or params[i + 1].kind is not p.POSITIONAL_ONLY):
            head.append("/")
        check = checks.get(p.name)
        if check is not None:
            names[f"_ok_{p.name}"], names[f"_c_{p.name}"] = check.ok, check
            first = "self" if constructor else "None"
            body.append(f"    if {p.name} is not _M and not _ok_{p.name}({p.name}):\n"
                        f"        _fail(_where({first}), {p.name!r}, _c_{p.name}, {p.name})")
    if not star:
        head.append("*_acc_rest")
    head.append("**_acc_extra")
    source = (f"def {fn.__name__}({', '.join(head)}):\n"
              + ("\n".join(body) or "    pass") + "\n")
    exec(compile(source, f"<accepts {where}>", "exec"), names)  # our own source, built above
    return typing.cast(Callable[..., None], names[fn.__name__])


def check_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Check a call of ``fn`` (decorated with ``accepts``) without making it: for an entry
    point that reaches ``fn`` another way (a metaclass routing a constructor elsewhere). A
    constructor's ``self`` may be the class: the message names it."""
    fn.__mpidist_check__(*args, **kwargs)  # type: ignore[attr-defined]


def accepts(**declared: Any) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Check the decorated function's arguments at entry (see the module docstring).

    ``declared`` maps argument names to hints and overrides the function's own hints for those
    arguments. ``name=Any`` turns off the check of a hinted argument.
    """
    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        params = list(inspect.signature(fn).parameters.values())
        unknown = set(declared) - {p.name for p in params}
        if unknown:
            raise TypeError(f"accepts: {fn.__qualname__} has no argument {sorted(unknown)}")
        where = _where(fn)

        def compile_once(*args: Any, **kwargs: Any) -> None:
            # On the first call: hints may name classes of higher layers (strings)
            globalns = getattr(fn, "__globals__", {})
            hints = {**getattr(fn, "__annotations__", {}), **declared}
            checks: dict[str, _Check] = {}
            for p in params:
                if p.name not in hints or p.name in ("self", "cls") \
                        or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    continue
                check = _compile(hints[p.name], globalns)
                if check is _ANY:
                    continue
                if check.constraints:
                    full = _Check(_with_constraints(check), check.text, check.types,
                                  check.element)
                    full.type_ok, full.confusions = check.type_ok, check.confusions
                    full.takes_callables = check.takes_callables
                    check = full
                checks[p.name] = check
            current[0] = _checker(fn, params, checks, where)
            current[0](*args, **kwargs)

        current: list[Callable[..., None]] = [compile_once]

        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            current[0](*args, **kwargs)
            return fn(*args, **kwargs)

        wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), **declared}
        wrapper.__mpidist_checked__ = True  # type: ignore[attr-defined]
        wrapper.__mpidist_check__ = lambda *a, **k: current[0](*a, **k)  # type: ignore[attr-defined]
        _checked.append(wrapper)
        return wrapper
    return decorate

"""Optimizer update rules: what an update computes, apart from where it runs.

A rule is one optimizer's arithmetic: its slots (names; each starts as zeros of its variable's
shape and dtype), its hyperparameters, and its formula, written once as array code (NumPy or
CuPy) for one variable, plus the name of its fused kernel in ``mpidist.kernels.optimizers``
(the same formula over a whole flat arena, bit for bit; its CUDA twin is
``kernels/optimizers_cuda.py``). Rules are registered by name, and the same rule serves every
applier: the fused local arena, the per-variable ``merge_call`` path and the parameter server,
which receives the rule's name and coefficients and runs its fused kernel next to the data.

A step goes through three stages, each written once:

1. ``rule.coefficients(lr, step)``: the step's scalars as Python floats, computed once per step
   (Adam's bias-corrected ``alpha``). They are also what travels to a parameter server.
2. ``Rule.cast(coefficients, dtype)``: the scalars in the variable's dtype, as the NumPy code
   casts them (``w.dtype.type(lr)``); a flag (Nesterov's) becomes a bool.
3. ``Rule.formula(w, g, slots, cast)`` (one variable, returns its new values) or
   ``Rule.fused(w, g, slots, cast)`` (flat arenas, in place).
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from mpidist.backend import array_module
from mpidist.kernels import optimizers as fused_kernels
from mpidist.types import Array

__all__ = ["UpdateRule", "VariableStep", "SGDRule", "MomentumRule", "AdamRule", "RULES",
           "register_rule", "rule_named", "positive_float", "flag"]


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool; TypeError naming ``name`` unless it is True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def positive_float(name: str, value: Any, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``); the error names ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {value!r}.")
    number = float(value)
    if number < 0 or (number == 0 and not allow_zero) or not np.isfinite(number):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {number}.")
    return number


class VariableStep(NamedTuple):
    """What ``formula`` returns for one variable: the new value of each slot (in the rule's
    slot order), and the change to the variable: ``w -= delta`` when ``subtract``, else
    ``w += delta`` (as the per-variable code writes it, so the bits are the fused kernel's)."""

    slots: tuple[Array, ...]
    delta: Array
    subtract: bool


class UpdateRule:
    """One optimizer's arithmetic (see the module docstring). An instance holds the validated
    hyperparameters; ``cast``, ``formula`` and ``fused`` need only the coefficients, so a
    parameter server runs a rule from its name and the coefficients alone."""

    name: ClassVar[str]
    kernel: ClassVar[str]  # the fused kernel's name in mpidist.kernels.optimizers
    slots: tuple[str, ...] = ()

    _fused_kernel: ClassVar[Callable[..., None]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fused_kernel = staticmethod(getattr(fused_kernels, cls.kernel))

    def hyperparameters(self) -> dict[str, Any]:
        """The settings that decide the update, by name (beside the learning rate)."""
        return {}

    def initial_slot(self, slot: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """The starting value of slot ``slot`` of a variable: zeros of its shape and dtype."""
        return np.zeros(shape, dtype)

    def coefficients(self, lr: float, step: int) -> tuple[float, ...]:
        """The scalars of update number ``step`` (1 for the first) at learning rate ``lr``."""
        raise NotImplementedError

    @staticmethod
    def cast(coefficients: Sequence[float], dtype: np.dtype) -> tuple[Any, ...]:
        """``coefficients`` as NumPy scalars of ``dtype`` (a rule with flags overrides it)."""
        return tuple(map(dtype.type, coefficients))

    @staticmethod
    def formula(w: Array, g: Array, slots: tuple[Array, ...], c: tuple[Any, ...]
                ) -> VariableStep:
        """One variable's update from its value ``w``, gradient ``g`` (in w's dtype), slot
        values and cast coefficients ``c``."""
        raise NotImplementedError

    @classmethod
    def fused(cls, w: Array, g: Array, slots: Sequence[Array], c: tuple[Any, ...]) -> None:
        """The fused kernel over flat buffers ``w``, ``g`` and ``slots``, in place."""
        cls._fused_kernel(w, g, *slots, *c)


RULES: dict[str, type[UpdateRule]] = {}


def register_rule(rule: type[UpdateRule]) -> type[UpdateRule]:
    """Register ``rule`` under its ``name`` (a class decorator); ValueError on a taken name."""
    if rule.name in RULES and RULES[rule.name] is not rule:
        raise ValueError(f"register_rule: the name {rule.name!r} is taken by "
                         f"{RULES[rule.name].__qualname__}; give {rule.__qualname__} another.")
    RULES[rule.name] = rule
    return rule


def rule_named(name: str) -> type[UpdateRule]:
    """The registered rule called ``name``; ValueError naming the known ones otherwise."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"No optimizer update rule is named {name!r}; registered: "
                         f"{sorted(RULES)}.") from None


@register_rule
class SGDRule(UpdateRule):
    """Gradient descent: ``w -= lr * g``."""

    name, kernel = "sgd", "sgd_update"

    def coefficients(self, lr: float, step: int) -> tuple[float, ...]:
        return (lr,)

    @staticmethod
    def formula(w: Array, g: Array, slots: tuple[Array, ...], c: tuple[Any, ...]
                ) -> VariableStep:
        (lr,) = c
        return VariableStep((), lr * g, True)


@register_rule
class MomentumRule(UpdateRule):
    """Keras's momentum: ``m = momentum * m - lr * g``; ``w += m``, or with Nesterov
    ``w += momentum * m - lr * g`` (with the new ``m``)."""

    name, kernel = "momentum", "sgd_momentum_update"
    slots = ("momentum",)

    def __init__(self, momentum: Any, nesterov: Any = False) -> None:
        self.momentum = positive_float("momentum", momentum, allow_zero=True)
        if self.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
        self.nesterov = flag("nesterov", nesterov)

    def hyperparameters(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "nesterov": self.nesterov}

    def coefficients(self, lr: float, step: int) -> tuple[float, ...]:
        return (lr, self.momentum, float(self.nesterov))

    @staticmethod
    def cast(coefficients: Sequence[float], dtype: np.dtype) -> tuple[Any, ...]:
        lr, momentum, nesterov = coefficients
        return (dtype.type(lr), dtype.type(momentum), bool(nesterov))

    @staticmethod
    def formula(w: Array, g: Array, slots: tuple[Array, ...], c: tuple[Any, ...]
                ) -> VariableStep:
        lr, momentum, nesterov = c
        m = momentum * slots[0] - lr * g
        return VariableStep((m,), momentum * m - lr * g if nesterov else m, False)


@register_rule
class AdamRule(UpdateRule):
    """Keras's Adam: ``m += (g - m)(1 - beta_1)``, ``v += (g² - v)(1 - beta_2)``,
    ``w -= alpha · m / (sqrt(v) + epsilon)`` with ``alpha = lr·sqrt(1 - beta_2^t)/(1 -
    beta_1^t)``; with ``amsgrad`` a third slot keeps the running maximum of ``v``, used in its
    place. The coefficients are ``(alpha, 1 - beta_1, 1 - beta_2, epsilon)``."""

    name, kernel = "adam", "adam_update"

    def __init__(self, beta_1: Any = 0.9, beta_2: Any = 0.999, epsilon: Any = 1e-7,
                 amsgrad: Any = False) -> None:
        for label, beta in (("beta_1", beta_1), ("beta_2", beta_2)):
            beta = positive_float(label, beta, allow_zero=True)
            if beta >= 1:
                raise ValueError(f"{label} must be in [0, 1), got {beta}.")
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)
        self.epsilon = positive_float("epsilon", epsilon)
        self.amsgrad = flag("amsgrad", amsgrad)
        self.slots = ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def hyperparameters(self) -> dict[str, Any]:
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "amsgrad": self.amsgrad}

    def coefficients(self, lr: float, step: int) -> tuple[float, ...]:
        alpha = lr * np.sqrt(1 - self.beta_2 ** step) / (1 - self.beta_1 ** step)
        return (alpha, 1 - self.beta_1, 1 - self.beta_2, self.epsilon)

    @staticmethod
    def formula(w: Array, g: Array, slots: tuple[Array, ...], c: tuple[Any, ...]
                ) -> VariableStep:
        alpha, one_minus_b1, one_minus_b2, eps = c
        xp = array_module(w)
        m = slots[0] + (g - slots[0]) * one_minus_b1
        v = slots[1] + (g * g - slots[1]) * one_minus_b2
        new: tuple[Array, ...] = (m, v)
        if len(slots) > 2:  # amsgrad: the running maximum of v replaces it in the step
            v = xp.maximum(slots[2], v)
            new = (m, new[1], v)
        return VariableStep(new, m * alpha / (xp.sqrt(v) + eps), True)

    @classmethod
    def fused(cls, w: Array, g: Array, slots: Sequence[Array], c: tuple[Any, ...]) -> None:
        vhat = slots[2] if len(slots) > 2 else None
        cls._fused_kernel(w, g, slots[0], slots[1], vhat, *c)


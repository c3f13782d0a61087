"""Bitwise checks of the CUDA twins of ``mpidist.kernels`` against the CPU twins and NumPy, on
whatever ``numba.cuda`` is: a real GPU, or Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
switched on before Numba is first imported; tests/scenarios/test_kernels_cudasim.py runs them so).

``run_checks()`` runs every check and returns ``{name: {"ok", "detail", "max_ulp"}}``:
``max_ulp`` is the largest difference, in units in the last place, of the comparison that
failed (0 when bit-identical, None where no numbers were compared). Each check compares the
CUDA twin (inputs made with ``numba.cuda.to_device``) with the CPU twin on the same host data,
bit for bit; the CPU twins are themselves checked against NumPy (tests/unit/test_kernels.py,
test_fused_apply.py), and some checks compare with NumPy's ``astype`` directly. On hardware
this is what shows the compiler's work (FMA contraction, conversions) that the simulator
cannot; the compile check (``kernels/compiled.py``) shows it in the PTX and SASS.

    python -m mpidist.kernels.bitwise_checks          # a GPU; or with NUMBA_ENABLE_CUDASIM=1

prints one line per check and a last line ``CUDASIM-REPORT: {json}``. Importing this module
imports neither Numba nor the kernels; only running the checks does. Sizes stay small: the
simulator runs one Python thread per CUDA thread.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["run_checks", "check_names", "on_simulator", "MARKER", "main"]

MARKER = "CUDASIM-REPORT: "
CHECKS: dict[str, Callable[[], None]] = {}

REDUCE_DTYPES = ["float16", "float32", "float64", "int32", "int64"]
REDUCE_SHAPES = [(), (0,), (3, 0), (1,), (7,), (4, 5), (300,)]
SHAPE_CYCLE = [(3,), (), (2, 3), (0,), (1, 4, 2), (3, 0), (5,), (2, 2), (6,)]
PACK_DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
PACK_COUNTS = [0, 1, 9, 17]
SPECIAL_VALUES = [
    70000.0, 65520.0, 65519.0, 65504.0, -65520.0, 2049.0, 2051.0, -2049.0, 1.0 + 2.0 ** -11,
    2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 1e-8,
    np.nan, -0.0, 0.0, np.inf, -np.inf, 0.1, 1.0 / 3.0, -2.5, 1024.5, 1025.5,
]
UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def check(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        assert name not in CHECKS, name
        CHECKS[name] = fn
        return fn
    return register


def check_names() -> Any:
    return list(CHECKS)


# -- helpers (numba is imported lazily, inside main's process) ----------------------------------

def _cuda() -> Any:
    from numba import cuda  # noqa: PLC0415 - Numba only when the checks run

    return cuda


def _k() -> Any:
    import mpidist.kernels as kernels  # noqa: PLC0415 - Numba only when the checks run

    return kernels


def dev(a: Any) -> Any:
    return _cuda().to_device(np.array(a, order="C"))


def host(d: Any) -> Any:
    return d.copy_to_host()


def bits(a: Any) -> Any:
    a = np.array(a, order="C")
    return a.view(UINT_OF_SIZE[a.dtype.itemsize])


_ULPS: list[int] = []  # the largest ulp difference of each comparison of the running check


def ulp_difference(got: Any, expected: Any) -> Any:
    """Per element, how many representable values lie between ``got`` and ``expected`` (floats:
    distance of their bit patterns in sign-magnitude order, so -0 and +0 are 1 apart; integers:
    the difference). Python ints: no overflow."""
    got, expected = np.asarray(got).ravel(), np.asarray(expected).ravel()
    if got.dtype.kind != "f":
        return [abs(int(a) - int(b)) for a, b in zip(got.tolist(), expected.tolist())]
    size = got.dtype.itemsize
    sign = 1 << (8 * size - 1)

    def ordered(x: Any) -> Any:
        u = [int(v) for v in x.view(UINT_OF_SIZE[size]).tolist()]
        return [-(v - sign) - 1 if v & sign else v for v in u]

    return [abs(a - b) for a, b in zip(ordered(got), ordered(expected))]


def same_bits(got: Any, expected: Any, what: str) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if np.array_equal(bits(got), bits(expected)):
        _ULPS.append(0)
        return
    diff = bits(got).ravel() != bits(expected).ravel()
    ulps = ulp_difference(got.ravel()[diff], expected.ravel()[diff])
    _ULPS.append(max(ulps))
    bad = np.flatnonzero(diff)[:5]
    raise AssertionError(
        f"{what}: {int(diff.sum())} of {diff.size} elements differ (max {max(ulps)} ulp), first "
        f"at {bad.tolist()}: got {got.ravel()[bad].tolist()} expected "
        f"{expected.ravel()[bad].tolist()}")


def nan_aware_same(got: Any, expected: Any, what: str) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
    same_bits(got[~nan], expected[~nan], what)


def assert_device(x: Any, what: str) -> None:
    from mpidist.kernels.arrays import is_device_array  # noqa: PLC0415 - Numba only when the checks run

    assert is_device_array(x) and not isinstance(x, np.ndarray), f"{what}: {type(x)} on host"


def random_array(rng: Any, dtype: Any, shape: Any) -> Any:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        scale = 10.0 ** rng.integers(-3, 4, size=shape)
        return np.asarray(rng.standard_normal(shape) * scale).astype(dtype)
    info = np.iinfo(dtype)
    low = 0 if dtype.kind == "u" else info.min
    return np.asarray(rng.integers(low, info.max, size=shape, dtype=dtype, endpoint=True))


def reduce_inputs(dtype: Any, shape: Any, n: Any, seed: Any) -> Any:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return [random_array(rng, dtype, shape) for _ in range(n)]
    bufs = [np.asarray(rng.integers(-1000, 1000, size=shape)).astype(dtype) for _ in range(n)]
    if bufs[0].size > 3:  # and some sums that wrap
        bufs[0].reshape(-1)[::3] = np.iinfo(dtype).max
    return bufs


def tensors_for(count: Any, dtype: Any, seed: Any) -> Any:
    rng = np.random.default_rng(seed)
    return [random_array(rng, dtype, SHAPE_CYCLE[i % len(SHAPE_CYCLE)]) for i in range(count)]


class Spy:
    """Counts the calls of a module function, then calls it."""

    def __init__(self, module: Any, name: Any) -> None:
        self.module, self.name, self.fn, self.calls = module, name, getattr(module, name), 0
        setattr(module, name, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)

    def restore(self) -> None:
        setattr(self.module, self.name, self.fn)


# -- the simulator and the twin that runs ---------------------------------------------------

def on_simulator() -> Any:
    """Whether the checks run (or would run) on Numba's CUDA simulator rather than a GPU."""
    if "numba" in sys.modules:
        from numba import config  # noqa: PLC0415

        return bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]  # not in the stubs
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@check("numba_cuda_target_is_the_one_asked_for")
def _() -> None:
    d = dev(np.arange(4.0))
    simulated = type(d).__module__.startswith("numba.cuda.simulator")
    wanted = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    assert simulated == wanted, f"device arrays are {type(d).__module__}, NUMBA_ENABLE_CUDASIM={wanted}"


@check("is_device_array_true_for_numba_device_arrays")
def _() -> None:
    from mpidist.kernels.arrays import is_device_array  # noqa: PLC0415 - Numba only when the checks run

    d = dev(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert is_device_array(d) is True
    assert is_device_array(_cuda().device_array(3, np.float16)) is True
    assert is_device_array(np.arange(3.0)) is False


@check("cuda_twin_runs_not_cpu_twin")
def _() -> None:
    import mpidist.kernels.cpu as kcpu  # noqa: PLC0415 - Numba only when the checks run
    import mpidist.kernels.cuda as kcuda  # noqa: PLC0415 - Numba only when the checks run

    k = _k()
    names = ["reduce_into", "reduce_half_into", "pack_chunk", "unpack_chunk", "cast_into"]
    gpu = {n: Spy(kcuda, n) for n in names}
    cpu = {n: Spy(kcpu, n) for n in names}
    try:
        a = dev(np.arange(10, dtype=np.float32))
        h = dev(np.arange(10, dtype=np.float16))
        assert_device(k.reduce_n([a, a]), "reduce_n")
        assert_device(k.reduce_n([h, h, h], divisor=3), "reduce_n float16")
        layout = k.FusionLayout([(10,), (10,)])
        flat = k.pack([a, a], dtype=np.float16)
        assert_device(flat, "pack")
        outs = k.unpack(flat, layout, dtype=np.float32)
        assert_device(outs[0], "unpack")
        assert_device(k.cast(a, np.float64), "cast")
        got = {n: (gpu[n].calls, cpu[n].calls) for n in names}
        assert got == {"reduce_into": (1, 0), "reduce_half_into": (1, 0), "pack_chunk": (1, 0),
                       "unpack_chunk": (1, 0), "cast_into": (1, 0)}, got
    finally:
        for spy in [*gpu.values(), *cpu.values()]:
            spy.restore()


# -- reduce_n ---------------------------------------------------------------------------------

def _register_reduce(dtype: Any, n: Any, op: Any) -> None:
    @check(f"reduce_{op}_{dtype}_n{n}")
    def _() -> None:
        k = _k()
        divisor = n if op == "mean" else None
        for shape in REDUCE_SHAPES:
            bufs = reduce_inputs(dtype, shape, n, seed=n * 100 + len(shape))
            expected = k.reduce_n([b.copy() for b in bufs], divisor=divisor)  # the CPU twin
            devs = [dev(b) for b in bufs]
            got = k.reduce_n(devs, divisor=divisor)
            assert_device(got, f"shape {shape}")
            same_bits(host(got), expected, f"shape {shape}")
            for d, b in zip(devs, bufs):
                same_bits(host(d), b, f"input of shape {shape} modified")


for _dtype in REDUCE_DTYPES:
    for _n in (1, 2, 3, 4):
        _register_reduce(_dtype, _n, "sum")
        if _dtype.startswith("float"):
            _register_reduce(_dtype, _n, "mean")


@check("reduce_float16_rounds_once")
def _() -> None:
    k = _k()
    bufs = [np.array([2048.0, 65504.0, 1.0], np.float16), np.array([1.0, 32.0, 2.0 ** -24], np.float16),
            np.array([1.0, -32.0, 2.0 ** -24], np.float16)]
    got = host(k.reduce_n([dev(b) for b in bufs]))
    # exact sums 2050, 65504, 1 + 2**-23 -> float16 2050, 65504, 1
    same_bits(got, np.array([2050.0, 65504.0, 1.0], np.float16), "sum")
    mean = host(k.reduce_n([dev(b) for b in bufs], divisor=3))
    same_bits(mean, (np.array([2050.0, 65504.0, 1.0 + 2.0 ** -23]) / 3).astype(np.float16), "mean")


@check("reduce_int32_wraps")
def _() -> None:
    k = _k()
    a = np.array([2**31 - 1, -(2**31), 5], np.int32)
    b = np.array([1, -1, 7], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the simulator adds NumPy scalars
        got = host(k.reduce_n([dev(a), dev(b)]))
    same_bits(got, np.array([-(2**31), 2**31 - 1, 12], np.int32), "wrapped sum")


@check("reduce_integer_mean_on_numba_arrays_raises")
def _() -> None:
    k = _k()
    d = dev(np.arange(4, dtype=np.int32))
    try:
        k.reduce_n([d, d], divisor=2)
    except ValueError as e:
        assert "Integer MEAN on Numba device arrays is not supported" in str(e), str(e)
    else:
        raise AssertionError("no ValueError")


@check("reduce_out_given")
def _() -> None:
    k = _k()
    cuda = _cuda()
    for dtype in ("float16", "float32", "int64"):
        bufs = reduce_inputs(dtype, (5, 7), 3, seed=9)
        expected = k.reduce_n([b.copy() for b in bufs])
        out = cuda.device_array((5, 7), dtype)
        assert k.reduce_n([dev(b) for b in bufs], out=out) is out
        same_bits(host(out), expected, f"{dtype} out")
        if dtype != "int64":
            expected_mean = k.reduce_n([b.copy() for b in bufs], divisor=3)
            devs = [dev(b) for b in bufs]
            assert k.reduce_n(devs, out=devs[0], divisor=3) is devs[0]
            same_bits(host(devs[0]), expected_mean, f"{dtype} mean into buffers[0]")
            same_bits(host(devs[1]), bufs[1], f"{dtype} buffers[1] modified")


def _expect_value_error(fn: Any, *fragments: Any) -> Any:
    try:
        fn()
    except ValueError as e:
        for fragment in fragments:
            assert fragment in str(e), f"{fragment!r} not in {str(e)!r}"
        return str(e)
    raise AssertionError(f"no ValueError (wanted {fragments})")


@check("reduce_non_contiguous_device_array_raises")
def _() -> None:
    k = _k()
    a = np.arange(20, dtype=np.float32)
    strided = dev(a)[::2]
    _expect_value_error(lambda: k.reduce_n([strided, strided]), "non-contiguous")
    whole = dev(a.reshape(4, 5))
    col = whole[:, 1:3]
    _expect_value_error(lambda: k.reduce_n([col, col]), "non-contiguous")
    _expect_value_error(lambda: k.reduce_n([dev(a[:10]), strided]), "non-contiguous")


@check("reduce_errors_on_device")
def _() -> None:
    k = _k()
    cuda = _cuda()
    a = dev(np.ones(4, np.float32))
    _expect_value_error(lambda: k.reduce_n([a, np.ones(4, np.float32)]),
                        "some buffers are GPU arrays and some host arrays")
    _expect_value_error(lambda: k.reduce_n([a, a], out=cuda.device_array(8, np.float32)[::2]),
                        "out must be C-contiguous")
    _expect_value_error(lambda: k.reduce_n([a, a], out=cuda.device_array(4, np.float64)),
                        "out must have shape (4,) and dtype float32")
    b = dev(np.ones(4, np.float32))
    _expect_value_error(lambda: k.reduce_n([a, b], out=b), "out may alias buffers[0] only")


# -- pack / unpack ----------------------------------------------------------------------------

def _register_pack(dtype: Any, count: Any) -> None:
    @check(f"pack_unpack_round_trip_{dtype}_{count}")
    def _() -> None:
        k = _k()
        cuda = _cuda()
        tensors = tensors_for(count, dtype, seed=count)
        layout = k.FusionLayout.of(tensors)
        expected = k.pack([t.copy() for t in tensors], dtype=dtype)  # the CPU twin
        devs = [dev(t) for t in tensors]
        if count == 0:
            out = cuda.device_array(0, dtype)
            flat = k.pack(devs, out=out)
            assert flat is out
        else:
            flat = k.pack(devs)
        assert_device(flat, "pack")
        same_bits(host(flat), expected, "flat")
        back = k.unpack(flat, layout)
        assert len(back) == count
        for i, (b, t) in enumerate(zip(back, tensors)):
            assert_device(b, f"unpack {i}")
            same_bits(host(b), t, f"tensor {i}")
        for i, (d, t) in enumerate(zip(devs, tensors)):
            same_bits(host(d), t, f"input {i} modified")


for _dtype in PACK_DTYPES:
    for _count in PACK_COUNTS:
        _register_pack(_dtype, _count)


@check("unpack_views_alias_the_flat_buffer")
def _() -> None:
    k = _k()
    tensors = [np.arange(6.0).reshape(2, 3), np.array(7.0), np.arange(4.0)]
    layout = k.FusionLayout.of(tensors)
    flat = k.pack([dev(t) for t in tensors])
    views = k.unpack(flat, layout)
    assert [tuple(v.shape) for v in views] == [(2, 3), (), (4,)]
    flat.copy_to_device(np.arange(100.0, 111.0))
    same_bits(host(views[0]), np.arange(100.0, 106.0).reshape(2, 3), "view 0 after write")
    same_bits(host(views[2]), np.arange(107.0, 111.0), "view 2 after write")


@check("unpack_into_given_out")
def _() -> None:
    k = _k()
    cuda = _cuda()
    tensors = tensors_for(9, np.float32, seed=3)
    layout = k.FusionLayout.of(tensors)
    flat = k.pack([dev(t) for t in tensors])
    outs = [cuda.device_array(s, np.float32) for s in layout.shapes]
    got = k.unpack(flat, layout, out=outs)
    assert all(g is o for g, o in zip(got, outs)) and len(got) == 9
    for i, (o, t) in enumerate(zip(outs, tensors)):
        same_bits(host(o), t, f"out {i}")
    outs16 = [cuda.device_array(s, np.float16) for s in layout.shapes]
    k.unpack(flat, layout, out=outs16)
    for i, (o, t) in enumerate(zip(outs16, tensors)):
        same_bits(host(o), t.astype(np.float16), f"float16 out {i}")


@check("pack_into_pooled_device_buffer")
def _() -> None:
    k = _k()
    tensors = [dev(t) for t in tensors_for(17, np.float32, seed=4)]
    layout = k.FusionLayout.of(tensors)
    pool = k.BufferPool()
    buf = pool.get(tensors[0], layout.total, np.float32)
    assert_device(buf, "pool buffer")
    assert k.pack(tensors, out=buf, layout=layout) is buf
    second = tensors_for(17, np.float32, seed=5)
    assert pool.get(tensors[1], layout.total, np.float32) is buf
    assert k.pack([dev(t) for t in second], out=buf, layout=layout) is buf
    same_bits(host(buf), np.concatenate([t.ravel() for t in second]), "second pack")
    assert len(pool) == 1 and pool.nbytes == layout.total * 4


@check("pack_non_contiguous_device_tensor_raises")
def _() -> None:
    k = _k()
    a = dev(np.arange(12.0))
    _expect_value_error(lambda: k.pack([dev(np.ones(2)), a[::3]]), "tensor 1", "non-contiguous")
    _expect_value_error(lambda: k.cast(a[::2], np.float16), "non-contiguous")


def _register_half_pack(source: Any) -> None:
    @check(f"pack_to_float16_from_{source}")
    def _() -> None:
        k = _k()
        values = np.array(SPECIAL_VALUES, np.float64).astype(source)
        rng = np.random.default_rng(7)
        noise = (rng.standard_normal(200) * 10.0 ** rng.integers(-9, 6, 200)).astype(source)
        pieces = [values[:9], values[9:15].reshape(2, 3), values[15:16].reshape(()),
                  np.zeros((2, 0), source), values[16:]] + np.split(noise, 8)
        layout = k.FusionLayout.of(pieces)
        expected = k.pack([p.copy() for p in pieces], dtype=np.float16)  # CPU twin
        with np.errstate(over="ignore"):
            numpy_expected = np.concatenate([p.ravel() for p in pieces]).astype(np.float16)
        same_bits(expected, numpy_expected, "CPU twin vs NumPy")
        flat = k.pack([dev(p) for p in pieces], dtype=np.float16)
        same_bits(host(flat), expected, "device pack")
        back = k.unpack(flat, layout, dtype=source)
        cpu_back = k.unpack(expected, layout, dtype=source)
        for i, (b, c) in enumerate(zip(back, cpu_back)):
            assert_device(b, f"unpack {i}")
            same_bits(host(b), c, f"unpack to {source} {i}")


for _source in ("float32", "float64"):
    _register_half_pack(_source)


# -- cast -------------------------------------------------------------------------------------

@check("cast_float32_to_float16")
def _() -> None:
    k = _k()
    rng = np.random.default_rng(11)
    mantissa = rng.uniform(1.0, 2.0, 300) * rng.choice([-1.0, 1.0], 300)
    x = np.concatenate([np.array(SPECIAL_VALUES, np.float32),
                        (mantissa * 2.0 ** rng.integers(-30, 18, 300)).astype(np.float32)])
    expected = k.cast(x.copy(), np.float16)
    got = k.cast(dev(x), np.float16)
    assert_device(got, "cast")
    same_bits(host(got), expected, "float32 -> float16")
    got2 = k.cast(dev(x.reshape(13, 25)), np.float16)
    same_bits(host(got2), expected.reshape(13, 25), "2-D cast")


@check("cast_float16_bit_patterns_to_float32_and_float64")
def _() -> None:
    k = _k()
    patterns = np.concatenate([np.arange(0, 65536, 173), [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400,
                                                          0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01,
                                                          0xFE00, 0x3C00]])
    halves = patterns.astype(np.uint16).view(np.float16)
    for target in (np.float32, np.float64):
        cpu = k.cast(halves.copy(), target)
        got = host(k.cast(dev(halves), target))
        nan_aware_same(got, cpu, f"float16 -> {np.dtype(target).name} vs CPU twin")
        nan_aware_same(got, halves.astype(target), f"float16 -> {np.dtype(target).name} vs NumPy")


@check("cast_into_out_and_zero_size")
def _() -> None:
    k = _k()
    cuda = _cuda()
    x = np.linspace(-3, 3, 40, dtype=np.float64).reshape(5, 8)
    out = cuda.device_array((5, 8), np.float32)
    assert k.cast(dev(x), np.float32, out=out) is out
    same_bits(host(out), k.cast(x, np.float32), "cast into out")
    z = k.cast(dev(np.zeros((3, 0), np.float32)), np.float16)
    assert tuple(z.shape) == (3, 0) and np.dtype(z.dtype) == np.float16


# -- float16 -> integer truncates, as NumPy's astype ------------------------------------------

_HALVES_IN_RANGE = [-2049.0, -100.9, -3.75, -2.5, -1.5, -0.99, -0.5, -0.0, 0.0, 0.25, 0.5, 0.99,
                    1.5, 2.5, 2.75, 3.5, 100.9, 1023.5, 2049.0, 65504.0]


def _register_half_to_int(target: Any) -> None:
    @check(f"cast_float16_to_{target}_truncates_as_numpy")
    def _() -> None:
        k = _k()
        halves = np.array(_HALVES_IN_RANGE, np.float16)
        expected = halves.astype(target)  # C truncation toward zero
        same_bits(k.cast(halves.copy(), target), expected, "CPU twin vs NumPy")
        same_bits(host(k.cast(dev(halves), target)), expected, "cast vs NumPy")
        layout = k.FusionLayout([(12,), (8,)])
        flat = k.pack([dev(halves[:12]), dev(halves[12:])], dtype=target)
        same_bits(host(flat), expected, "pack to an integer buffer vs NumPy")
        back = k.unpack(dev(halves), layout, dtype=target)
        same_bits(np.concatenate([host(b) for b in back]), expected, "unpack vs NumPy")


for _target in ("int32", "int64"):
    _register_half_to_int(_target)


# -- fused optimizers ---------------------------------------------------------------------------

OPTIMIZER_SIZE = 300


def _optimizer_inputs(dtype: Any, seed: Any) -> Any:
    rng = np.random.default_rng(seed)

    def spread(scale_lo: Any, scale_hi: Any) -> Any:
        scale = 10.0 ** rng.integers(scale_lo, scale_hi, OPTIMIZER_SIZE)
        return (rng.standard_normal(OPTIMIZER_SIZE) * scale).astype(dtype)

    w, g, m = spread(-3, 2), spread(-6, 1), spread(-6, 0)
    v = np.abs(spread(-10, -1))
    vhat = np.where(rng.random(OPTIMIZER_SIZE) < 0.5, v * 2, v / 2).astype(dtype)
    return w, g, m, v, vhat


def _register_optimizer(rule: Any, dtype: Any) -> None:
    @check(f"optimizer_{rule}_{dtype}")
    def _() -> None:
        from mpidist.kernels import optimizers  # noqa: PLC0415

        t = np.dtype(dtype).type
        w, g, m, v, vhat = _optimizer_inputs(dtype, seed=len(rule))
        host_state = [a.copy() for a in (w, m, v, vhat)]
        dev_state = [dev(a) for a in (w, m, v, vhat)]
        dg = dev(g)
        for state, grad in ((host_state, g), (dev_state, dg)):
            sw, sm, sv, svh = state
            if rule == "sgd":
                optimizers.sgd_update(sw, grad, t(0.01))
            elif rule in ("momentum", "nesterov"):
                optimizers.sgd_momentum_update(sw, grad, sm, t(0.01), t(0.9), rule == "nesterov")
            else:
                optimizers.adam_update(sw, grad, sm, sv, svh if rule == "amsgrad" else None,
                                       t(0.001 * np.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3)),
                                       t(1 - 0.9), t(1 - 0.999), t(1e-7))
        if rule == "sgd":  # and the NumPy expression the CPU twin replaces
            same_bits(host(dev_state[0]), w - t(0.01) * g, "w vs NumPy")
        for name, h, d in zip(("w", "m", "v", "vhat"), host_state, dev_state):
            same_bits(host(d), h, f"{name} vs the CPU twin")


for _dtype in ("float32", "float64"):
    for _rule in ("sgd", "momentum", "nesterov", "adam", "amsgrad"):
        _register_optimizer(_rule, _dtype)


# -- runner -------------------------------------------------------------------------------------

def run_checks(names: Any = None) -> Any:
    """Run the checks (all, or ``names``) on the current ``numba.cuda`` target, a GPU or the
    simulator: ``{name: {"ok": bool, "detail": str, "max_ulp": int | None}}``."""
    if not __debug__:
        raise RuntimeError("the kernel checks are assertions: run Python without -O")
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy scalar overflow in the simulator
        for name in (list(CHECKS) if names is None else names):
            _ULPS.clear()
            try:
                CHECKS[name]()
            except Exception:  # noqa: BLE001 - every failure goes into the report
                ok, detail = False, traceback.format_exc(limit=6)
            else:
                ok, detail = True, ""
            results[name] = {"ok": ok, "detail": detail, "max_ulp": max(_ULPS) if _ULPS else None}
    return results


def main() -> Any:
    if not on_simulator():
        from numba import cuda  # noqa: PLC0415

        if not cuda.is_available():
            print("no CUDA GPU (numba.cuda.is_available() is False): run on a GPU, or set "
                  "NUMBA_ENABLE_CUDASIM=1 for Numba's simulator", file=sys.stderr)
            return 2
    results = run_checks()
    for name, r in results.items():
        ulp = "" if r["ok"] or r["max_ulp"] is None else f"  max {r['max_ulp']} ulp"
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {name}{ulp}")
    print(MARKER + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

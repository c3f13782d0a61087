"""The fused CPU kernels of mpidist.kernels (Numba njit twins) on NumPy arrays: N-way reduce,
pack / unpack of fusion buffers with float16 cast on the way, cast, BufferPool, and the pure
Python plans (FusionLayout, split_sizes, group_by_size). The CUDA twins are checked under
Numba's simulator in tests/scenarios/test_kernels_cudasim.py."""

import functools

import numpy as np
import pytest

from mpidist import kernels
from mpidist.kernels import (
    BufferPool,
    FusionLayout,
    cast,
    group_by_size,
    pack,
    reduce_n,
    split_sizes,
    unpack,
)
from mpidist.kernels import cpu as kcpu
from mpidist.kernels.bitwise_checks import random_array

KERNEL_DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
INT_DTYPES = [np.int32, np.int64]
# (5000,) spans two of the CPU kernel's 4096-element cache blocks.
SHAPES = [(), (0,), (3, 0), (1,), (7,), (4, 5), (2, 3, 4), (5000,)]
NS = [1, 2, 3, 4, 5]
# Every dtype a fusion buffer may hold.
PACK_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
               np.uint8, np.uint16, np.uint32, np.uint64]
SHAPE_CYCLE = [(3,), (), (2, 3), (0,), (1, 4, 2), (3, 0), (5,), (2, 2), (6,)]
TENSOR_COUNTS = [0, 1, 7, 8, 9, 17, 100]
UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def bits(a):
    """The raw bits of a float array (so -0.0 != 0.0 and NaN payloads count)."""
    a = np.ascontiguousarray(a)
    return a.view(UINT_OF_SIZE[a.dtype.itemsize])


def assert_identical(got, expected):
    """Same type, dtype, shape and, for floats, the same bits."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(bits(got), bits(expected))
    else:
        np.testing.assert_array_equal(got, expected)


def assert_nan_aware_bits(got, expected):
    """NaN where expected is NaN (any payload); elsewhere the same bits."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(expected)[~nan])


def make_buffers(dtype, shape, n, seed=0):
    """n arrays of modest values (sums stay far from overflow except where a test wants it)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return [random_array(rng, dtype, shape) for _ in range(n)]
    return [np.asarray(rng.integers(-1000, 1000, size=shape)).astype(dtype) for _ in range(n)]


def numpy_sum(bufs):
    """NumPy's sequential sum in the buffers' dtype (ints wrap)."""
    return functools.reduce(np.add, bufs)


def exact_half_sum(bufs):
    """The float16 contract: exact float64 sum, rounded to float16 once."""
    return numpy_sum([b.astype(np.float64) for b in bufs]).astype(np.float16)


def expected_sum(bufs):
    if bufs[0].dtype == np.float16:
        return exact_half_sum(bufs)
    return np.asarray(numpy_sum(bufs), dtype=bufs[0].dtype)


def expected_mean(bufs, divisor):
    if bufs[0].dtype == np.float16:
        exact = numpy_sum([b.astype(np.float64) for b in bufs])
        return np.asarray(exact / divisor).astype(np.float16)
    # NumPy: float32 / python int stays float32; integers true-divide into float64.
    return np.asarray(np.true_divide(numpy_sum(bufs), divisor))


def tensors_for(count, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [random_array(rng, dtype, SHAPE_CYCLE[i % len(SHAPE_CYCLE)]) for i in range(count)]


def concat(tensors, dtype=None):
    flat = np.concatenate([np.ravel(t) for t in tensors]) if tensors else np.empty(0, dtype)
    return flat if dtype is None else flat.astype(dtype)


# --------------------------------------------------------------------------------------------
# reduce_n: SUM and MEAN against NumPy
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_sum_matches_numpy(dtype, n, shape):
    bufs = make_buffers(dtype, shape, n, seed=n)
    before = [b.copy() for b in bufs]
    got = reduce_n(bufs)
    assert_identical(got, expected_sum(before))
    for b, orig in zip(bufs, before):
        assert_identical(b, orig)  # inputs untouched
    if n > 1:
        assert all(got is not b for b in bufs)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_mean_matches_numpy(dtype, n, shape):
    bufs = make_buffers(dtype, shape, n, seed=10 + n)
    before = [b.copy() for b in bufs]
    got = reduce_n(bufs, divisor=n)
    expected = expected_mean(before, n)
    assert expected.dtype == (np.float64 if np.dtype(dtype).kind == "i" else dtype)
    assert_identical(got, expected)
    for b, orig in zip(bufs, before):
        assert_identical(b, orig)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int16],
                         ids=lambda d: np.dtype(d).name)
def test_reduce_integer_mean_of_0d_returns_an_array(dtype):
    # np.true_divide of a 0-d array alone gives a NumPy scalar; reduce_n returns an array.
    got = reduce_n([np.array(3, dtype), np.array(4, dtype)], divisor=2)
    assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == np.float64
    assert got == 3.5


def test_reduce_float32_mean_is_one_division_of_the_float32_sum():
    a = np.array([1.0, 0.1, 3.0, 1e-7, 16777216.0], np.float32)
    b = np.array([2.0, 0.2, 4.0, 1.0, 1.0], np.float32)
    c = np.array([3.0, 0.3, 5.0, 1.0, 1.0], np.float32)
    got = reduce_n([a, b, c], divisor=3)
    expected = np.true_divide((a + b) + c, 3)
    assert expected.dtype == np.float32
    assert_identical(got, expected)
    assert got[0] == 2.0 and got[2] == 4.0


def test_reduce_mean_with_non_integer_divisor():
    a = np.array([1.0, 2.0, 3.0], np.float64)
    b = np.array([4.0, 5.0, 7.0], np.float64)
    assert_identical(reduce_n([a, b], divisor=2.5), np.array([2.0, 2.8, 4.0]))


def test_reduce_float16_rounds_once_not_per_addition():
    # Sequentially in float16: 2048 + 1 -> 2048 (tie to even), + 1 -> 2048. Exactly: 2050.
    bufs = [np.array([2048.0, 1.0], np.float16), np.array([1.0, 2.0 ** -24], np.float16),
            np.array([1.0, 2.0 ** -24], np.float16)]
    assert numpy_sum(bufs)[0] == 2048.0
    got = reduce_n(bufs)
    assert got.dtype == np.float16
    assert got[0] == 2050.0
    assert got[1] == np.float16(1.0)  # 1 + 2**-23 rounds back to 1 in float16
    assert_identical(got, exact_half_sum(bufs))


def test_reduce_float16_mean_rounds_the_exact_quotient():
    bufs = [np.array([2048.0, 65504.0, -3.0], np.float16),
            np.array([1.0, 65504.0, 0.5], np.float16),
            np.array([1.0, 65504.0, 0.25], np.float16)]
    got = reduce_n(bufs, divisor=3)
    # 2050 / 3 = 683.33 -> 683.5; 3 * 65504 overflows float16 but not float64: 65504 back.
    np.testing.assert_array_equal(got, np.array([683.5, 65504.0, -0.75], np.float16))
    assert_identical(got, expected_mean(bufs, 3))


def test_reduce_float16_overflow_and_special_values():
    bufs = [np.array([65504.0, np.inf, -np.inf, np.nan, -0.0, 0.0], np.float16),
            np.array([32.0, 1.0, -np.inf, 1.0, -0.0, -0.0], np.float16)]
    got = reduce_n(bufs)
    # 65536 is exactly halfway between 65504 and 2**16 -> rounds to even, i.e. inf.
    assert np.isposinf(got[0]) and np.isposinf(got[1]) and np.isneginf(got[2])
    assert np.isnan(got[3])
    assert bits(got)[4] == 0x8000  # -0 + -0 = -0
    assert bits(got)[5] == 0x0000  # +0 + -0 = +0
    below_tie = reduce_n([np.array([65504.0], np.float16), np.array([15.0], np.float16)])
    assert below_tie[0] == 65504.0  # 65519 < 65520 rounds down


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_integer_overflow_wraps_like_numpy(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, -1, 5], dtype)
    b = np.array([1, -1, info.max, info.min, 7], dtype)
    c = np.array([1, 0, 2, 0, 1], dtype)
    got = reduce_n([a, b, c])
    expected = np.array([info.min + 1, info.max, 0, info.max, 13], dtype)
    assert_identical(got, expected)
    assert_identical(got, numpy_sum([a, b, c]))
    # MEAN divides the wrapped sum, in float64 (NumPy's true division).
    mean = reduce_n([a, b, c], divisor=3)
    assert_identical(mean, np.true_divide(numpy_sum([a, b, c]), 3))
    assert mean[4] == 13 / 3


def test_reduce_int32_max_plus_one_is_min():
    a = np.full(4, 2**31 - 1, np.int32)
    got = reduce_n([a, np.ones(4, np.int32)])
    assert_identical(got, np.full(4, -(2**31), np.int32))


# --------------------------------------------------------------------------------------------
# reduce_n: the parallel kernel for large buffers
# --------------------------------------------------------------------------------------------

class _Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.mark.parametrize("dtype,n,size,divisor", [
    (np.float32, 4, 300_000, None),
    (np.float32, 4, 300_000, 4),
    (np.float64, 2, 100_003, None),
    (np.int32, 3, 70_001, None),
    (np.int64, 2, 50_000, 2),
    (np.float16, 3, 140_001, None),
    (np.float16, 2, 200_000, 2),
], ids=["float32-sum", "float32-mean", "float64-sum", "int32-sum-wraps", "int64-mean",
        "float16-sum", "float16-mean"])
def test_reduce_large_buffers_take_parallel_kernel_and_match_numpy(monkeypatch, dtype, n, size,
                                                                    divisor):
    # The parallel kernel runs only on >= 4 cores (kcpu.PARALLEL); force it so it is checked
    # on any machine.
    monkeypatch.setattr(kcpu, "PARALLEL", True)
    half = np.dtype(dtype) == np.float16
    serial_name = "_reduce_half_serial" if half else "_reduce_serial"
    parallel_name = "_reduce_half_parallel" if half else "_reduce_parallel"
    serial = _Spy(getattr(kcpu, serial_name))
    parallel = _Spy(getattr(kcpu, parallel_name))
    monkeypatch.setattr(kcpu, serial_name, serial)
    monkeypatch.setattr(kcpu, parallel_name, parallel)
    bufs = make_buffers(dtype, (size,), n, seed=size)
    if np.dtype(dtype).kind == "i":  # make the sums wrap too
        info = np.iinfo(dtype)
        bufs[0][::7] = info.max
    assert size * np.dtype(dtype).itemsize * (n + 1) >= kcpu.PARALLEL_MIN_BYTES
    before = [b.copy() for b in bufs]
    got = reduce_n(bufs, divisor=divisor)
    assert (serial.calls, parallel.calls) == (0, 1)
    expected = expected_sum(before) if divisor is None else expected_mean(before, divisor)
    assert_identical(got, expected)
    for b, orig in zip(bufs, before):
        assert_identical(b, orig)


@pytest.mark.parametrize("parallel_allowed,size,expected_calls", [
    (True, 1000, (1, 0)),      # small: serial even where the thread pool is allowed
    (False, 300_000, (1, 0)),  # large, but too few cores: serial
    (True, 300_000, (0, 1)),
])
def test_reduce_serial_or_parallel_kernel(monkeypatch, parallel_allowed, size, expected_calls):
    monkeypatch.setattr(kcpu, "PARALLEL", parallel_allowed)
    serial = _Spy(kcpu._reduce_serial)
    parallel = _Spy(kcpu._reduce_parallel)
    monkeypatch.setattr(kcpu, "_reduce_serial", serial)
    monkeypatch.setattr(kcpu, "_reduce_parallel", parallel)
    bufs = make_buffers(np.float32, (size,), 3)
    assert (size * 4 * 4 >= kcpu.PARALLEL_MIN_BYTES) == (size > 1000)
    assert_identical(reduce_n(bufs), expected_sum(bufs))
    assert (serial.calls, parallel.calls) == expected_calls


# --------------------------------------------------------------------------------------------
# reduce_n: out=
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("divisor", [None, 3])
def test_reduce_into_given_out(dtype, divisor):
    bufs = make_buffers(dtype, (4, 6), 3, seed=3)
    result_dtype = np.float64 if (divisor and np.dtype(dtype).kind == "i") else dtype
    out = np.full((4, 6), 99, result_dtype)
    got = reduce_n(bufs, out=out, divisor=divisor)
    assert got is out
    expected = expected_sum(bufs) if divisor is None else expected_mean(bufs, divisor)
    assert_identical(out, expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_reduce_into_first_buffer(dtype, n):
    bufs = make_buffers(dtype, (5000,), n, seed=7)
    expected = expected_sum([b.copy() for b in bufs])
    rest = [b.copy() for b in bufs[1:]]
    got = reduce_n(bufs, out=bufs[0])
    assert got is bufs[0]
    assert_identical(bufs[0], expected)
    for b, orig in zip(bufs[1:], rest):
        assert_identical(b, orig)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_mean_into_first_buffer(dtype):
    bufs = make_buffers(dtype, (33,), 4, seed=8)
    expected = expected_mean([b.copy() for b in bufs], 4)
    assert reduce_n(bufs, out=bufs[0], divisor=4) is bufs[0]
    assert_identical(bufs[0], expected)


def test_reduce_into_zero_size_and_0d_out():
    z = [np.zeros((3, 0), np.float32)] * 2
    out = np.zeros((3, 0), np.float32)
    assert reduce_n(z, out=out) is out
    s = [np.array(1.5, np.float64), np.array(2.25, np.float64)]
    out0 = np.array(0.0)
    assert reduce_n(s, out=out0) is out0
    assert out0.shape == () and out0 == 3.75


# --------------------------------------------------------------------------------------------
# reduce_n: errors
# --------------------------------------------------------------------------------------------

def test_reduce_rejects_empty_list():
    with pytest.raises(ValueError, match="reduce_n needs at least one buffer to reduce"):
        reduce_n([])


def test_reduce_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"buffer 2 has shape \(2, 2\) but buffer 0 has shape \(4,\)"):
        reduce_n([np.zeros(4), np.zeros(4), np.zeros((2, 2))])


def test_reduce_rejects_mismatched_dtypes():
    with pytest.raises(ValueError, match="buffer 1 has dtype float64 but buffer 0 has dtype float32"):
        reduce_n([np.zeros(4, np.float32), np.zeros(4, np.float64)])


@pytest.mark.parametrize("out,message", [
    (np.zeros(5, np.float32), r"out must have shape \(4,\) and dtype float32; got shape \(5,\) "
                              r"and dtype float32"),
    (np.zeros(4, np.float64), r"out must have shape \(4,\) and dtype float32; got shape \(4,\) "
                              r"and dtype float64"),
    (np.zeros((2, 2), np.float32), r"out must have shape \(4,\)"),
    (np.zeros(8, np.float32)[::2], "out must be C-contiguous"),
], ids=["length", "dtype", "shape", "strided"])
def test_reduce_rejects_bad_out(out, message):
    bufs = [np.ones(4, np.float32), np.ones(4, np.float32)]
    out_before = out.copy()
    with pytest.raises(ValueError, match=message):
        reduce_n(bufs, out=out)
    np.testing.assert_array_equal(out, out_before)


def test_reduce_rejects_non_contiguous_2d_out():
    bufs = [np.ones((3, 3), np.float64)] * 2
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        reduce_n(bufs, out=np.zeros((3, 3)).T)


def test_reduce_integer_mean_needs_float64_out():
    bufs = [np.ones(3, np.int32)] * 2
    with pytest.raises(ValueError, match=r"out must have shape \(3,\) and dtype float64; got shape "
                                         r"\(3,\) and dtype int32"):
        reduce_n(bufs, out=np.zeros(3, np.int32), divisor=2)


@pytest.mark.parametrize("which", [1, 2])
def test_reduce_rejects_out_aliasing_a_later_buffer(which):
    bufs = [np.ones(4, np.float32), np.full(4, 2.0, np.float32), np.full(4, 3.0, np.float32)]
    with pytest.raises(ValueError, match=r"out may alias buffers\[0\] only"):
        reduce_n(bufs, out=bufs[which])
    np.testing.assert_array_equal(bufs[which], np.full(4, which + 1.0))


@pytest.mark.parametrize("divisor", [0, -1, -2.5, 0.0, True, False])
def test_reduce_rejects_bad_divisor(divisor):
    with pytest.raises(ValueError, match=f"divisor must be a positive count or None, got {divisor!r}"):
        reduce_n([np.ones(3), np.ones(3)], divisor=divisor)


# --------------------------------------------------------------------------------------------
# reduce_n: non-contiguous and read-only inputs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("view", ["step", "transpose", "column_slice", "mixed"])
def test_reduce_non_contiguous_inputs(dtype, view):
    base = make_buffers(dtype, (6, 8), 3, seed=21)
    if view == "step":
        bufs = [b[::2, ::3] for b in base]
    elif view == "transpose":
        bufs = [b.T for b in base]
    elif view == "column_slice":
        bufs = [b[:, 1:4] for b in base]
    else:  # one contiguous, one transposed copy, one reversed
        bufs = [np.ascontiguousarray(base[0][:, ::-1]), base[1][:, ::-1], base[2][:, ::-1]]
    assert not all(b.flags.c_contiguous for b in bufs)
    dense = [np.ascontiguousarray(b) for b in bufs]
    got = reduce_n(bufs)
    assert got.flags.c_contiguous
    assert_identical(got, expected_sum(dense))
    if np.dtype(dtype).kind == "f":
        assert_identical(reduce_n(bufs, divisor=3), expected_mean(dense, 3))
    for b, orig in zip(base, make_buffers(dtype, (6, 8), 3, seed=21)):
        assert_identical(b, orig)


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("pattern", ["all", "first", "last", "alternate", "single"])
def test_reduce_read_only_inputs(dtype, pattern):
    n = 1 if pattern == "single" else 4
    bufs = make_buffers(dtype, (50,), n, seed=30)
    flags = {"all": [True] * n, "first": [True, False, False, False],
             "last": [False, False, False, True], "alternate": [True, False, True, False],
             "single": [True]}[pattern]
    inputs = [_read_only(b) if ro else b.copy() for b, ro in zip(bufs, flags)]
    assert [not b.flags.writeable for b in inputs] == flags
    assert_identical(reduce_n(inputs), expected_sum(bufs))
    if np.dtype(dtype).kind == "f":
        assert_identical(reduce_n(inputs, divisor=n), expected_mean(bufs, n))
    for b, orig in zip(inputs, bufs):
        assert_identical(b, orig)
    assert [not b.flags.writeable for b in inputs] == flags


def test_reduce_read_only_non_contiguous_mixed():
    base = make_buffers(np.float32, (10, 10), 3, seed=31)
    a = _read_only(base[0])[::2]
    b = base[1][::2]
    c = _read_only(base[2][::2])
    dense = [np.ascontiguousarray(x) for x in (a, b, c)]
    assert_identical(reduce_n([a, b, c]), expected_sum(dense))


# --------------------------------------------------------------------------------------------
# reduce_n: dtypes outside the kernels take NumPy's loops
# --------------------------------------------------------------------------------------------

def test_reduce_uint8_fallback_wraps_like_numpy():
    a = np.array([250, 1, 128, 0], np.uint8)
    b = np.array([10, 2, 128, 0], np.uint8)
    c = np.array([1, 3, 1, 255], np.uint8)
    got = reduce_n([a, b, c])
    assert_identical(got, np.array([5, 6, 1, 255], np.uint8))
    mean = reduce_n([a, b, c], divisor=3)
    assert_identical(mean, np.array([5 / 3, 2.0, 1 / 3, 85.0]))
    out = np.zeros(4)
    assert reduce_n([a, b, c], divisor=3, out=out) is out
    assert_identical(out, mean)
    np.testing.assert_array_equal(a, [250, 1, 128, 0])


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64, np.uint8, np.int16, np.uint32],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_reduce_fallback_dtypes_equal_numpy(dtype, n):
    rng = np.random.default_rng(n)
    if np.dtype(dtype).kind == "c":
        bufs = [(rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(dtype)
                for _ in range(n)]
    else:
        bufs = [random_array(rng, dtype, (3, 4)) for _ in range(n)]
    before = [b.copy() for b in bufs]
    assert_identical(reduce_n(bufs), np.asarray(numpy_sum(before)))
    assert_identical(reduce_n(bufs, divisor=n), np.asarray(np.true_divide(numpy_sum(before), n)))
    out = np.zeros((3, 4), dtype)
    assert reduce_n(bufs, out=out) is out
    assert_identical(out, np.asarray(numpy_sum(before)))
    for b, orig in zip(bufs, before):
        assert_identical(b, orig)


def test_reduce_complex_fallback_into_first_buffer_and_mean():
    a = np.array([1 + 1j, 2 - 2j], np.complex128)
    b = np.array([3 + 0j, 1j], np.complex128)
    assert reduce_n([a, b], out=a, divisor=2) is a
    np.testing.assert_array_equal(a, [2 + 0.5j, 1 - 0.5j])
    np.testing.assert_array_equal(b, [3 + 0j, 1j])


def test_reduce_fallback_rejects_out_aliasing_later_buffer():
    bufs = [np.ones(3, np.complex128), np.ones(3, np.complex128)]
    with pytest.raises(ValueError, match=r"out may alias buffers\[0\] only"):
        reduce_n(bufs, out=bufs[1])


# --------------------------------------------------------------------------------------------
# pack / unpack
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", TENSOR_COUNTS)
@pytest.mark.parametrize("dtype", PACK_DTYPES, ids=lambda d: np.dtype(d).name)
def test_pack_unpack_round_trip(dtype, count):
    tensors = tensors_for(count, dtype, seed=count)
    before = [t.copy() for t in tensors]
    layout = FusionLayout.of(tensors)
    flat = pack(tensors, dtype=dtype if count == 0 else None)
    assert flat.ndim == 1 and flat.flags.c_contiguous
    assert flat.shape == (layout.total,)
    assert_identical(flat, concat(before, dtype))
    back = unpack(flat, layout)
    assert len(back) == count
    for got, t in zip(back, before):
        assert_identical(got, t)
        if t.size:
            assert np.shares_memory(got, flat)
    for t, orig in zip(tensors, before):
        assert_identical(t, orig)


@pytest.mark.parametrize("count", [1, 9, 17])
def test_pack_with_cached_layout_equals_fresh_layout(count):
    tensors = tensors_for(count, np.float32, seed=5)
    layout = FusionLayout(SHAPE_CYCLE[i % len(SHAPE_CYCLE)] for i in range(count))
    assert layout == FusionLayout.of(tensors)
    assert_identical(pack(tensors, layout=layout), pack(tensors))


def test_pack_layout_offsets_place_each_tensor():
    tensors = [np.array([1, 2, 3], np.int32), np.array(4, np.int32),
               np.zeros((2, 0), np.int32), np.array([[5, 6], [7, 8]], np.int32)]
    flat = pack(tensors)
    assert_identical(flat, np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int32))
    layout = FusionLayout.of(tensors)
    assert layout.starts == (0, 3, 4, 4)
    back = unpack(flat, layout)
    assert [b.shape for b in back] == [(3,), (), (2, 0), (2, 2)]
    assert back[1] == 4 and back[3][1, 0] == 7


def test_pack_empty_list_with_dtype():
    flat = pack([], dtype=np.float16)
    assert_identical(flat, np.empty(0, np.float16))
    assert unpack(flat, FusionLayout([])) == []
    out = np.empty(0, np.float32)
    assert pack([], out=out) is out


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_pack_non_contiguous_and_read_only_tensors(dtype):
    rng = np.random.default_rng(2)
    base = [random_array(rng, dtype, (4, 6)) for _ in range(11)]
    tensors = [base[0].T, base[1][::2, 1::2], _read_only(base[2]), base[3],
               _read_only(base[4])[:, ::-1], base[5][1:3], base[6].T[::3],
               np.asfortranarray(base[7]), base[8][0], _read_only(base[9])[2, 3, ...], base[10]]
    assert tensors[9].shape == () and not tensors[9].flags.writeable
    flat = pack(tensors)
    dense = [np.array(t, order="C") for t in tensors]
    assert_identical(flat, concat(dense))
    for got, t in zip(unpack(flat, FusionLayout.of(tensors)), dense):
        assert_identical(got, t)


def test_pack_all_read_only_tensors():
    tensors = [_read_only(t) for t in tensors_for(12, np.float64, seed=3)]
    assert_identical(pack(tensors), concat(tensors))
    assert_identical(pack(tensors, dtype=np.float16), concat(tensors).astype(np.float16))


@pytest.mark.parametrize("count", [1, 9, 17])
@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.float16])
def test_pack_into_given_out(dtype, count):
    tensors = tensors_for(count, dtype, seed=11)
    layout = FusionLayout.of(tensors)
    out = np.zeros(layout.total, dtype)
    assert pack(tensors, out=out) is out
    assert_identical(out, concat(tensors))
    out2 = np.zeros(layout.total, dtype)
    assert pack(tensors, out=out2, layout=layout) is out2
    assert_identical(out2, out)


def test_pack_into_pooled_buffer_twice_reuses_it():
    pool = BufferPool()
    first = tensors_for(17, np.float32, seed=1)
    second = tensors_for(17, np.float32, seed=2)
    layout = FusionLayout.of(first)
    buf = pool.get(first[0], layout.total, np.float32)
    assert buf.shape == (layout.total,) and buf.dtype == np.float32
    got1 = pack(first, out=buf, layout=layout)
    assert got1 is buf
    assert_identical(buf, concat(first))
    again = pool.get(second[0], layout.total, np.float32)
    assert again is buf
    got2 = pack(second, out=again, layout=layout)
    assert got2 is buf
    assert_identical(buf, concat(second))
    assert len(pool) == 1 and pool.nbytes == layout.total * 4


def test_pack_into_pooled_float16_buffer_casts():
    pool = BufferPool()
    tensors = tensors_for(9, np.float32, seed=4)
    total = FusionLayout.of(tensors).total
    buf = pool.get(tensors[0], total, np.float16)
    assert pack(tensors, out=buf) is buf
    assert_identical(buf, concat(tensors).astype(np.float16))


def test_unpack_views_share_memory_with_flat():
    tensors = [np.arange(6, dtype=np.float64).reshape(2, 3), np.array(7.0), np.zeros(0)]
    layout = FusionLayout.of(tensors)
    flat = pack(tensors)
    views = unpack(flat, layout)
    assert np.shares_memory(views[0], flat) and np.shares_memory(views[1], flat)
    flat[:] = -1.0
    np.testing.assert_array_equal(views[0], np.full((2, 3), -1.0))
    assert views[1] == -1.0
    same_dtype = unpack(flat, layout, dtype=np.float64)  # no cast: still views
    assert np.shares_memory(same_dtype[0], flat)


@pytest.mark.parametrize("count", [1, 8, 9, 17])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_unpack_into_given_out(dtype, count):
    tensors = tensors_for(count, dtype, seed=12)
    layout = FusionLayout.of(tensors)
    flat = pack(tensors)
    outs = [np.full(t.shape, 3, dtype) for t in tensors]
    got = unpack(flat, layout, out=outs)
    assert len(got) == count
    for g, o, t in zip(got, outs, tensors):
        assert g is o
        assert_identical(o, t)
        assert not np.shares_memory(o, flat)


def test_unpack_with_cast_copies():
    tensors = tensors_for(9, np.float32, seed=13)
    layout = FusionLayout.of(tensors)
    flat = pack(tensors)
    got = unpack(flat, layout, dtype=np.float64)
    for g, t in zip(got, tensors):
        assert_identical(g, t.astype(np.float64))
        assert not np.shares_memory(g, flat)


# --------------------------------------------------------------------------------------------
# float16 cast on pack / unpack
# --------------------------------------------------------------------------------------------

SPECIAL_VALUES = [
    70000.0, 65520.0, 65519.0, 65504.0, -65520.0, -70000.0, 1e30, -1e30,  # overflow edge
    2049.0, 2051.0, 2050.0, -2049.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,  # ties to even
    2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25,  # subnormals
    2.0 ** -26, 1e-8, -1e-8, 6.1e-5, 5.96e-8, 1e-30, -1e-30,
    np.nan, -0.0, 0.0, np.inf, -np.inf, 0.1, 1.0 / 3.0, -2.5, 1.0, 1024.5, 1025.5,
]


@pytest.mark.parametrize("source", [np.float32, np.float64])
def test_pack_to_float16_matches_numpy_bit_for_bit(source):
    values = np.array(SPECIAL_VALUES, np.float64).astype(source)
    rng = np.random.default_rng(40)
    noise = (rng.standard_normal(1000) * 10.0 ** rng.integers(-9, 6, 1000)).astype(source)
    pieces = [values[:5], values[5:14].reshape(3, 3), values[14:15].reshape(()), values[15:30],
              np.zeros((2, 0), source), values[30:]] + np.split(noise, 10)
    flat = pack(pieces, dtype=np.float16)
    with np.errstate(over="ignore"):  # 70000 etc. overflow to inf on purpose
        expected = np.concatenate([p.ravel() for p in pieces]).astype(np.float16)
    assert flat.dtype == np.float16
    np.testing.assert_array_equal(bits(flat), bits(expected))
    head = dict(zip(SPECIAL_VALUES, flat[: len(SPECIAL_VALUES)].tolist()))
    assert head[2049.0] == 2048.0 and head[2051.0] == 2052.0 and head[-2049.0] == -2048.0
    assert head[70000.0] == np.inf and head[65520.0] == np.inf and head[-65520.0] == -np.inf
    assert head[65519.0] == 65504.0
    assert head[2.0 ** -25] == 0.0 and head[3 * 2.0 ** -25] == 2.0 ** -23
    assert head[2.0 ** -14 - 2.0 ** -25] == 2.0 ** -14
    h = bits(flat[: len(SPECIAL_VALUES)])
    assert h[SPECIAL_VALUES.index(-0.0)] == 0x8000
    assert h[SPECIAL_VALUES.index(2.0 ** -24)] == 0x0001
    nan_at = SPECIAL_VALUES.index(np.nan)
    assert np.isnan(flat[nan_at]) and h[nan_at] == 0x7E00


def test_unpack_from_float16_to_float32_matches_astype():
    with np.errstate(over="ignore"):
        values = np.array(SPECIAL_VALUES, np.float64).astype(np.float16)
    rng = np.random.default_rng(41)
    noise = (rng.standard_normal(500) * 10.0 ** rng.integers(-6, 4, 500)).astype(np.float16)
    flat = np.concatenate([values, noise])
    shapes = [(len(SPECIAL_VALUES),)] + [(50,)] * 9 + [(5, 10)]
    layout = FusionLayout(shapes)
    got = unpack(flat, layout, dtype=np.float32)
    for g, view in zip(got, layout.views(flat)):
        assert_identical(g, view.astype(np.float32))
    outs = [np.empty(s, np.float64) for s in shapes]
    returned = unpack(flat, layout, out=outs)
    assert len(returned) == len(outs) and all(r is o for r, o in zip(returned, outs))
    for o, view in zip(outs, layout.views(flat)):
        assert_identical(o, view.astype(np.float64))


@pytest.mark.parametrize("source", [np.float32, np.float64])
def test_pack_float16_round_trip_to_source_dtype(source):
    tensors = tensors_for(17, source, seed=42)
    layout = FusionLayout.of(tensors)
    flat16 = pack(tensors, dtype=np.float16)
    back = unpack(flat16, layout, dtype=source)
    for b, t in zip(back, tensors):
        assert_identical(b, t.astype(np.float16).astype(source))


def test_pack_float16_tensors_to_float32():
    tensors = [t.astype(np.float16) for t in tensors_for(9, np.float32, seed=43)]
    flat = pack(tensors, dtype=np.float32)
    assert_identical(flat, concat(tensors).astype(np.float32))


# --------------------------------------------------------------------------------------------
# cast
# --------------------------------------------------------------------------------------------

ALL_HALVES = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)


@pytest.mark.parametrize("target", [np.float32, np.float64])
def test_cast_every_float16_bit_pattern(target):
    got = cast(ALL_HALVES, target)
    expected = ALL_HALVES.astype(target)
    assert np.isnan(expected).sum() == 2046
    assert_nan_aware_bits(got, expected)


def test_cast_float16_to_float16_keeps_bits():
    got = cast(ALL_HALVES, np.float16)
    np.testing.assert_array_equal(bits(got), bits(ALL_HALVES))


def _wide_floats(rng, n, lo, hi, dtype):
    mantissa = rng.uniform(1.0, 2.0, n)
    sign = rng.choice([-1.0, 1.0], n)
    return (sign * mantissa * 2.0 ** rng.integers(lo, hi, n)).astype(dtype)


@pytest.mark.parametrize("source", [np.float32, np.float64])
def test_cast_random_wide_range_to_float16(source):
    rng = np.random.default_rng(50)
    x = _wide_floats(rng, 1_000_000, -30, 18, source)
    got = cast(x, np.float16)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    # the range really covers zeros, subnormals, normals and infinities
    e = np.abs(expected.astype(np.float64))
    assert (e == 0).any() and ((e > 0) & (e < 2.0 ** -14)).any() and np.isinf(e).any()
    np.testing.assert_array_equal(bits(got), bits(expected))


def test_cast_float16_ties_and_halfway_subnormals():
    # Exact midpoints between neighbouring float16 values, which NumPy rounds to even.
    h = ALL_HALVES[np.isfinite(ALL_HALVES)].astype(np.float64)
    h = np.unique(h)
    mids = ((h[:-1] + h[1:]) / 2).astype(np.float32)
    np.testing.assert_array_equal(bits(cast(mids, np.float16)), bits(mids.astype(np.float16)))
    assert cast(np.array([2049.0, 2051.0], np.float32), np.float16).tolist() == [2048.0, 2052.0]


def test_cast_into_out_and_shapes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.1
    out = np.empty((3, 4), np.float16)
    assert cast(x, np.float16, out=out) is out
    assert_identical(out, x.astype(np.float16))
    assert_identical(cast(x.T, np.float64), x.T.astype(np.float64))  # non-contiguous input
    assert_identical(cast(np.full((), 2.5, np.float32), np.float16),
                     np.array(2.5, np.float16))
    assert_identical(cast(np.zeros((0, 3), np.float16), np.float32), np.zeros((0, 3), np.float32))
    assert_identical(cast(np.arange(5, dtype=np.int32), np.float64), np.arange(5.0))
    ro = _read_only(x)
    assert_identical(cast(ro, np.float16), x.astype(np.float16))


def test_cast_rejects_bad_dtypes_and_out():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="cast: dtype has dtype complex128; fusion buffers hold "
                                         "integer or floating-point data only"):
        cast(x, np.complex128)
    with pytest.raises(ValueError, match="cast: the input has dtype complex64"):
        cast(np.ones(3, np.complex64), np.float32)
    with pytest.raises(ValueError, match=r"out must have shape \(3,\) and dtype float16; got shape "
                                         r"\(4,\) and dtype float16"):
        cast(x, np.float16, out=np.empty(4, np.float16))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        cast(np.ones((2, 2), np.float32), np.float16, out=np.empty((2, 2), np.float16).T)


# --------------------------------------------------------------------------------------------
# pack / unpack errors
# --------------------------------------------------------------------------------------------

def test_pack_rejects_mixed_dtypes():
    with pytest.raises(ValueError, match="pack: tensor 2 has dtype float64 but tensor 0 has dtype "
                                         "float32; a fusion buffer holds one dtype"):
        pack([np.ones(2, np.float32), np.ones(3, np.float32), np.ones(1, np.float64)])


def test_pack_rejects_layout_count_mismatch():
    tensors = [np.ones(2), np.ones(3), np.ones(1)]
    with pytest.raises(ValueError, match="pack: the layout describes 2 tensors, got 3"):
        pack(tensors, layout=FusionLayout([(2,), (3,)]))


def test_pack_rejects_layout_shape_mismatch():
    tensors = [np.ones(2), np.ones((3, 1))]
    with pytest.raises(ValueError, match=r"pack: tensor 1 has shape \(3, 1\); the layout says \(3,\)"):
        pack(tensors, layout=FusionLayout([(2,), (3,)]))


def test_pack_rejects_bad_out():
    tensors = [np.ones(2, np.float32), np.ones(3, np.float32)]
    with pytest.raises(ValueError, match=r"out must have shape \(5,\) and dtype float32; got shape "
                                         r"\(6,\)"):
        pack(tensors, out=np.empty(6, np.float32), dtype=np.float32)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        pack(tensors, out=np.empty(10, np.float32)[::2])


@pytest.mark.parametrize("kind", ["tensors", "dtype", "flat", "unpack_dtype"])
def test_complex_is_rejected(kind):
    message = "fusion buffers hold integer or floating-point data only"
    with pytest.raises(ValueError, match=message):
        if kind == "tensors":
            pack([np.ones(2, np.complex128)])
        elif kind == "dtype":
            pack([np.ones(2, np.float32)], dtype=np.complex64)
        elif kind == "flat":
            unpack(np.ones(2, np.complex128), FusionLayout([(2,)]))
        else:
            unpack(np.ones(2, np.float32), FusionLayout([(2,)]), dtype=np.complex64)


def test_pack_rejects_empty_list_without_dtype():
    with pytest.raises(ValueError, match="pack: no tensors and no dtype: pass dtype="):
        pack([])


def test_unpack_rejects_wrong_flat_length():
    layout = FusionLayout([(2, 3), ()])
    with pytest.raises(ValueError, match=r"unpack: the flat buffer has shape \(6,\) but the layout "
                                         r"needs \(7,\)"):
        unpack(np.ones(6), layout)
    with pytest.raises(ValueError, match=r"unpack: the flat buffer has shape \(7, 1\)"):
        unpack(np.ones((7, 1)), layout)


def test_unpack_rejects_bad_out():
    layout = FusionLayout([(2,), (3,)])
    flat = np.arange(5.0)
    with pytest.raises(ValueError, match="unpack: 2 tensors in the layout, 1 in out"):
        unpack(flat, layout, out=[np.empty(2)])
    with pytest.raises(ValueError, match=r"out\[1\] must have shape \(3,\) and dtype float64; got "
                                         r"shape \(4,\)"):
        unpack(flat, layout, out=[np.empty(2), np.empty(4)])
    with pytest.raises(ValueError, match=r"out\[1\] must have shape \(3,\) and dtype float64; got "
                                         r"shape \(3,\) and dtype float32"):
        unpack(flat, layout, out=[np.empty(2), np.empty(3, np.float32)])


# --------------------------------------------------------------------------------------------
# BufferPool
# --------------------------------------------------------------------------------------------

def test_buffer_pool_keys_and_accounting():
    pool = BufferPool()
    like = np.zeros(3, np.float32)
    a = pool.get(like, 10, np.float32)
    assert a.shape == (10,) and a.dtype == np.float32 and isinstance(a, np.ndarray)
    assert pool.get(like, 10, "float32") is a
    assert pool.get(np.zeros(1, np.int64), np.int64(10), np.float32) is a  # host is one place
    b = pool.get(like, 10, np.float32, slot=1)
    c = pool.get(like, 10, np.float16)
    d = pool.get(like, 11, np.float32)
    assert len({id(x) for x in (a, b, c, d)}) == 4
    assert len(pool) == 4
    assert pool.nbytes == 10 * 4 + 10 * 4 + 10 * 2 + 11 * 4
    pool.clear()
    assert len(pool) == 0 and pool.nbytes == 0
    fresh = pool.get(like, 10, np.float32)
    assert fresh is not a and len(pool) == 1


# --------------------------------------------------------------------------------------------
# FusionLayout, split_sizes, group_by_size
# --------------------------------------------------------------------------------------------

def test_fusion_layout_table():
    layout = FusionLayout([(2, 3), (), (0,), (4,), (3, 0, 2)])
    assert layout.shapes == ((2, 3), (), (0,), (4,), (3, 0, 2))
    assert layout.sizes == (6, 1, 0, 4, 0)
    assert layout.starts == (0, 6, 7, 7, 11)
    assert layout.total == 11
    assert len(layout) == 5
    empty = FusionLayout([])
    assert (empty.shapes, empty.sizes, empty.starts, empty.total, len(empty)) == ((), (), (), 0, 0)


def test_fusion_layout_views():
    layout = FusionLayout([(2, 3), (), (0,), (4,)])
    flat = np.arange(11.0)
    views = layout.views(flat)
    assert [v.shape for v in views] == [(2, 3), (), (0,), (4,)]
    np.testing.assert_array_equal(views[0], [[0, 1, 2], [3, 4, 5]])
    assert views[1] == 6.0
    np.testing.assert_array_equal(views[3], [7, 8, 9, 10])
    assert all(np.shares_memory(v, flat) for v in views if v.size)
    with pytest.raises(ValueError, match=r"A flat buffer of shape \(11,\) is needed for "
                                         r"FusionLayout\(4 tensors, 11 elements\), got shape \(12,\)"):
        layout.views(np.arange(12.0))


def test_fusion_layout_equality_and_hash():
    a = FusionLayout([(2, 3), (4,)])
    b = FusionLayout([[np.int64(2), np.int32(3)], (4,)])
    assert b.shapes == ((2, 3), (4,)) and all(type(d) is int for d in b.shapes[0])
    assert a == b and hash(a) == hash(b)
    assert a != FusionLayout([(3, 2), (4,)]) and a != FusionLayout([(6,), (4,)])
    assert a != ((2, 3), (4,))
    assert len({a, b, FusionLayout([(6,), (4,)])}) == 2
    assert {a: "cached"}[b] == "cached"
    tensors = [np.zeros((2, 3), np.float16), np.zeros(4, np.int8)]
    assert FusionLayout.of(tensors) == a
    assert FusionLayout.of([np.float32(1.0), np.zeros((0, 5))]).shapes == ((), (0, 5))
    assert repr(a) == "FusionLayout(2 tensors, 10 elements)"


@pytest.mark.parametrize("total,num_packs,expected", [
    (11, 3, [3, 3, 5]),
    (12, 3, [4, 4, 4]),
    (10, 4, [2, 2, 2, 4]),
    (2, 3, [0, 0, 2]),
    (0, 2, [0, 0]),
    (5, 1, [5]),
    (7, np.int64(2), [3, 4]),
])
def test_split_sizes(total, num_packs, expected):
    got = split_sizes(total, num_packs)
    assert got == expected
    assert sum(got) == total


@pytest.mark.parametrize("num_packs", [0, -1, True, 2.0, None])
def test_split_sizes_rejects_bad_num_packs(num_packs):
    with pytest.raises(ValueError, match="num_packs must be greater than zero"):
        split_sizes(10, num_packs)


SIZES_BYTES = [4 * n for n in (10, 20, 5, 30, 1)]  # float32 element counts -> bytes


@pytest.mark.parametrize("bytes_per_pack,expected", [
    (1, [[0], [1], [2], [3], [4]]),
    (39, [[0], [1], [2, 3], [4]]),
    (40, [[0, 1], [2, 3], [4]]),
    (100, [[0, 1], [2, 3], [4]]),
    (140, [[0, 1, 2, 3], [4]]),
    (1000, [[0, 1, 2, 3, 4]]),
    (0, [[0, 1, 2, 3, 4]]),
])
def test_group_by_size(bytes_per_pack, expected):
    assert SIZES_BYTES == [40, 80, 20, 120, 4]
    assert group_by_size(SIZES_BYTES, bytes_per_pack) == expected


def test_group_by_size_edges():
    assert group_by_size([], 10) == []
    assert group_by_size([], 0) == []
    assert group_by_size([5], 1) == [[0]]
    assert group_by_size([0, 0, 0], 0) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="bytes_per_pack must be >= 0, got -1"):
        group_by_size(SIZES_BYTES, -1)


@pytest.mark.parametrize("name", ["reduce_n", "pack", "unpack", "cast", "BufferPool",
                                  "FusionLayout", "split_sizes", "group_by_size"])
def test_package_exports(name):
    assert name in kernels.__all__
    assert callable(getattr(kernels, name))


def test_out_overlapping_a_later_buffer_is_rejected():
    a, b = np.ones(8), np.arange(16.0)
    with pytest.raises(ValueError, match="overlaps a later buffer"):
        kernels.reduce_n([a, b[:8]], out=b[4:12])
    np.testing.assert_array_equal(b, np.arange(16.0))  # nothing written


def test_read_only_out_is_a_clear_value_error():
    out = np.empty(4)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.reduce_n([np.ones(4), np.ones(4)], out=out)


@pytest.mark.parametrize("divisor", [np.True_, float("nan"), 0.0, -1])
def test_bad_divisors_are_rejected(divisor):
    with pytest.raises(ValueError, match="divisor must be a positive count"):
        kernels.reduce_n([np.ones(4), np.ones(4)], divisor=divisor)


# --------------------------------------------------------------------------------------------
# CUDA launches: on the array's device and stream, without a host sync per tensor. Tested with
# the recording stand-in for CuPy (tests/recording_cupy.py) and a recorder in place of Numba's
# device contexts: a test of OUR placement logic, nothing runs on a GPU.
# --------------------------------------------------------------------------------------------

class _NumbaDevices:
    """Stands in for numba.cuda's ``gpus``, ``external_stream`` and ``as_cuda_array``."""

    def __init__(self):
        self.current = []  # Numba device contexts entered, innermost last
        self.conversions = []  # sync= of each as_cuda_array call
        self.launches = []

    def __getitem__(self, device_id):
        devices = self

        class _Context:
            def __enter__(self):
                devices.current.append(device_id)

            def __exit__(self, *exc):
                devices.current.pop()

        return _Context()

    def external_stream(self, ptr):
        return ("external", ptr)

    def as_cuda_array(self, obj, sync=True):
        self.conversions.append(sync)
        return obj  # the stand-in array itself: kernels are recorded, not run


@pytest.fixture
def on_gpu1(monkeypatch):
    """The CuPy stand-in (two devices, device 0 current) and Numba's device calls recorded;
    kernel launches are recorded with the device and stream current at launch."""
    from numba import cuda as numba_cuda
    from recording_cupy import install

    from mpidist.backend import cupy_backend
    from mpidist.kernels import cuda as kcuda

    cupy = install(monkeypatch, num_devices=2)
    numba = _NumbaDevices()
    monkeypatch.setattr(numba_cuda, "gpus", numba, raising=False)
    monkeypatch.setattr(numba_cuda, "external_stream", numba.external_stream)
    monkeypatch.setattr(numba_cuda, "as_cuda_array", numba.as_cuda_array)

    def launch(kernel, config, stream, *args):
        arrays = [a for x in args for a in (x if isinstance(x, tuple) else (x,))
                  if isinstance(a, cupy.ndarray)]
        rec = cupy.recording
        rec.launch(getattr(kernel, "__name__", "kernel"), reads=tuple(arrays[1:]),
                   writes=tuple(arrays[:1]))  # raises WrongDeviceError off the arrays' device
        numba.launches.append({"cupy_device": rec.current_device(),
                               "numba_device": numba.current[-1] if numba.current else None,
                               "stream": stream,
                               "device1_stream": ("external", rec.current_stream(1).ptr)})

    monkeypatch.setattr(kcuda, "launch", launch)
    with cupy.cuda.Device(1):
        side = cupy.cuda.Stream(non_blocking=True)
    yield cupy, numba, side
    cupy_backend.reset()


def _on_device1(cupy, values):
    with cupy.cuda.Device(1):
        return cupy.asarray(np.asarray(values))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_half", "pack", "unpack_cast",
                                "cast", "sgd", "adam"])
def test_cuda_launches_run_on_the_arrays_device_and_stream(on_gpu1, op):
    from mpidist.kernels import optimizers

    cupy, numba, side = on_gpu1
    with cupy.cuda.Device(1):
        side.use()  # device 1's current stream is `side`...
    assert cupy.recording.current_device() == 0  # ...and device 0 is current for the call
    x = _on_device1(cupy, np.arange(6, dtype=np.float32))
    y = _on_device1(cupy, np.ones(6, np.float32))
    if op == "reduce_sum":
        reduce_n([x, y])
    elif op == "reduce_mean":
        reduce_n([x, y], divisor=2)
    elif op == "reduce_half":
        reduce_n([_on_device1(cupy, np.ones(4, np.float16))] * 2)
    elif op == "pack":
        pack([x, y])
    elif op == "unpack_cast":
        unpack(_on_device1(cupy, np.arange(12, dtype=np.float32)), FusionLayout([(6,), (6,)]),
               dtype=np.float16)
    elif op == "cast":
        cast(x, np.float64)
    elif op == "sgd":
        optimizers.sgd_update(x, y, np.float32(0.1))
    else:
        m, v = _on_device1(cupy, np.zeros(6, np.float32)), _on_device1(cupy, np.zeros(6, np.float32))
        optimizers.adam_update(x, y, m, v, None, *(np.float32(a) for a in (0.1, 0.1, 0.001, 1e-7)))
    assert numba.launches, "no kernel launched"
    for launch in numba.launches:
        assert launch["cupy_device"] == 1 and launch["numba_device"] == 1, launch
        assert launch["stream"] == launch["device1_stream"] == ("external", side.ptr), launch
    assert numba.conversions and not any(numba.conversions), \
        f"as_cuda_array synchronized the host: sync={numba.conversions}"


def test_ulp_difference_counts_representable_values_between():
    from mpidist.kernels.bitwise_checks import ulp_difference

    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2))
    assert ulp_difference(np.array([up, one, -0.0, 3.0], np.float32),
                          np.array([one, one, 0.0, 3.0], np.float32)) == [1, 0, 1, 0]
    tiny = np.float64(5e-324)
    assert ulp_difference(np.array([-tiny]), np.array([tiny])) == [3]  # -tiny, -0, +0, tiny
    assert ulp_difference(np.array([np.inf], np.float16), np.array([65504], np.float16)) == [1]
    assert ulp_difference(np.array([7], np.int64), np.array([-2], np.int64)) == [9]

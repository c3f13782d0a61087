"""``Dataset.map(num_parallel_calls=N, deterministic=...)``: the function runs on N threads at
once; results in the input's order by default (an error at the element that raised it), or as
they finish with ``deterministic=False``; ``ignore_errors`` still drops the failing elements;
the arguments are checked. Generated cases compare every setting with the plain map."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpidist.data import AUTOTUNE, Dataset
from mpidist.data.parallel_map import cores_of_this_rank
from mpidist.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(60)


def values(dataset):
    return [np.asarray(v).tolist() for v in dataset.as_numpy_iterator()]


@given(n=st.integers(0, 60), threads=st.integers(1, 6), deterministic=st.sampled_from(
    [None, True, False]), batched=st.booleans())
@settings(max_examples=40, deadline=None)
def test_every_setting_gives_the_plain_maps_elements(n, threads, deterministic, batched):
    source = Dataset.range(n).batch(4) if batched else Dataset.range(n)
    plain = values(source.map(lambda x: x * 3 + 1))
    parallel = values(source.map(lambda x: x * 3 + 1, num_parallel_calls=threads,
                                 deterministic=deterministic))
    if deterministic is False:
        assert sorted(map(str, parallel)) == sorted(map(str, plain))
    else:
        assert parallel == plain


def test_calls_run_at_the_same_time():
    """Two calls on real elements meet at a barrier: only possible when they run at once (one
    thread would wait at the barrier until its timeout). The stand-in elements map's tracing
    runs the function on (for element_spec) pass by."""
    barrier = threading.Barrier(2, timeout=10)

    def meet(x):
        if len(x) == 2 and x[1] != x[0]:  # a real batch [2k, 2k+1], not a stand-in of ones
            barrier.wait()
        return x

    dataset = Dataset.range(12).batch(2).map(meet, num_parallel_calls=2)
    assert [v for batch in values(dataset) for v in batch] == list(range(12))


def test_an_error_is_raised_at_its_element_in_order():
    def fail_at_5(x):
        if x == 5:
            raise ValueError(f"element {x} is bad")
        return x

    got = []
    with pytest.raises(ValueError, match="element 5 is bad"):
        for v in Dataset.range(20).map(fail_at_5, num_parallel_calls=3).as_numpy_iterator():
            got.append(int(v))
    assert got == [0, 1, 2, 3, 4]
    kept = values(Dataset.range(10).map(fail_at_5, num_parallel_calls=3).ignore_errors())
    assert kept == [0, 1, 2, 3, 4, 6, 7, 8, 9]


def test_autotune_uses_the_cores_of_this_rank():
    assert cores_of_this_rank() >= 1
    assert values(Dataset.range(5).map(lambda x: -x, num_parallel_calls=AUTOTUNE)) == \
        [0, -1, -2, -3, -4]


@pytest.mark.parametrize("bad,error,message", [
    (0, InvalidArgumentError, "num_parallel_calls must be greater than zero, got 0."),
    (-2, InvalidArgumentError, "num_parallel_calls must be greater than zero, got -2."),
    (2.0, TypeError, "num_parallel_calls must be an int, got 2.0 of type float."),
    ("4", TypeError, "num_parallel_calls must be an int, got '4' of type str."),
])
def test_a_wrong_thread_count_is_refused(bad, error, message):
    with pytest.raises(error) as info:
        Dataset.range(3).map(lambda x: x, num_parallel_calls=bad)
    assert str(info.value) == message


def test_deterministic_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^deterministic must be True or False, got 'False' "):
        Dataset.range(3).map(lambda x: x, num_parallel_calls=2, deterministic="False")


def test_an_abandoned_iterator_leaves_no_work_queued():
    started = []
    it = iter(Dataset.range(1000).map(lambda x: started.append(1) or x, num_parallel_calls=2))
    next(it)
    it.close()
    assert len(started) <= 8  # at most 2 * threads in flight, plus the first

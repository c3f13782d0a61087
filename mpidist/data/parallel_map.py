"""``Dataset.map(..., num_parallel_calls=N)``: the map function run on N threads at once.

Threads, not processes: NumPy, pyarrow, protobuf parsing, decompression and file reads release
the GIL, so a map function made of them runs on several cores from threads, with no pickling of
elements or of the function (``benchmarks/parallel_map.py`` measures the speedup). A function
that holds the GIL throughout (pure-Python loops) gains nothing, as under tf.data's own
``py_function``.

At most ``2 * N`` elements are in flight, so memory stays bounded whatever the dataset's size.
``deterministic=True`` (TF's default) yields the results in the input's order, an error at the
element that raised it; ``deterministic=False`` yields each result as soon as it is ready.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from collections.abc import Callable, Iterator
from typing import Any

from mpidist.core.waiting import wait_until

__all__ = ["map_in_parallel", "cores_of_this_rank"]

_FIRST = concurrent.futures.FIRST_COMPLETED


def cores_of_this_rank() -> int:
    """The cores this process may run on (its affinity: a rank bound to 4 cores gets 4)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def map_in_parallel(call: Callable[[Any, int], Any], elements: Iterator[Any], threads: int,
                    deterministic: bool) -> Iterator[concurrent.futures.Future[Any]]:
    """The finished futures of ``call(element, index)`` for each element, run on ``threads``
    threads: in the input's order when ``deterministic``, else as they finish. The caller takes
    each future's ``result()`` (which raises the call's error). Abandoning the iterator cancels
    what has not started and lets the running calls finish on their own."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads,
                                                     thread_name_prefix="mpidist-map")
    pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
    try:
        for index, element in enumerate(elements):
            pending.append(executor.submit(call, element, index))
            if len(pending) >= 2 * threads:
                yield _next_done(pending, deterministic)
        while pending:
            yield _next_done(pending, deterministic)
    finally:
        for future in pending:
            future.cancel()
        executor.shutdown(wait=False)


def _next_done(pending: collections.deque[concurrent.futures.Future[Any]],
               deterministic: bool) -> concurrent.futures.Future[Any]:
    """The oldest future (deterministic) or the first to finish, once finished; removed from
    ``pending``. Waits under the local deadline (MPIDIST_WAIT_TIMEOUT) like every wait."""
    if deterministic:
        oldest = pending[0]
        if oldest.done():
            return pending.popleft()
        wait_until(oldest.done, "the map function on the next element",
                   "the dataset's map threads",
                   pause=lambda at_most: concurrent.futures.wait(  # wait-ok: one bounded pause
                       [oldest], timeout=at_most))
        return pending.popleft()
    wait_until(lambda: any(f.done() for f in pending), "the map function on any element",
               "the dataset's map threads",
               pause=lambda at_most: concurrent.futures.wait(  # wait-ok: one bounded pause
                   pending, timeout=at_most, return_when=_FIRST))
    done = next(f for f in pending if f.done())
    pending.remove(done)
    return done

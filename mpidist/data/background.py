"""Running an iterator ahead in a thread: ``Dataset.prefetch`` and the per-replica buffer of a
distributed iterator, so that producing the next element overlaps consuming this one."""

import queue
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

from mpidist.core.waiting import get_item

__all__ = ["iterate_in_background"]

T = TypeVar("T")
_END = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def iterate_in_background(it: Iterator[T], buffer_size: int) -> Iterator[T]:
    """Run iterator ``it`` ahead in a daemon thread, at most ``buffer_size`` elements ahead.
    Errors surface at the element where they happened; abandoning the iterator stops the
    thread."""
    q: queue.Queue[Any] = queue.Queue(maxsize=buffer_size)  # elements, _END or a _Failure
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for element in it:
                if not put(element):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(_Failure(e))

    thread = threading.Thread(target=produce, name="mpidist-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = get_item(q, "the next element of the dataset",
                            "the prefetch thread running the dataset's iterator")
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()

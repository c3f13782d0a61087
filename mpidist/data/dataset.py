"""``mpidist.data.Dataset``: the part of ``tf.data`` the distribution guides use, over NumPy.

A Dataset is an immutable, lazy pipeline: each transformation returns a new Dataset wrapping
its input, and iterating one runs the chain from the source. Elements are NumPy arrays or
nested tuples / dicts of them. As in tf.data, a Python *list* is data (one array), while a tuple
or dict is structure.

Randomness is explicit and reproducible: ``shuffle(seed=s)`` gives the same sequence of orders on
every run and every rank; without a seed, a distributed dataset agrees one seed across workers
(see ``mpidist.data.distributed``) so sharding by data never duplicates or loses an example.

The implementation is split by operation, as TF keeps one module per dataset op: the
``Dataset`` base class in ``mpidist.data.base``, ``IterationContext`` in
``mpidist.data.context``, the file readers' base in ``mpidist.data.file_reader`` and each
transformation's node in ``mpidist.data.ops``. This module keeps the names it always had.
"""

from mpidist.data.base import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    SHARD_HINT,
    UNKNOWN_CARDINALITY,
    Dataset,
    file_count,
    file_shard_units,
    find_file_reader,
    has_shard_hints,
    iterate,
    order_units,
    source_row_count,
    source_units,
    specs_match,
    stack_elements,
    static_batch_size,
)
from mpidist.data.context import IterationContext
from mpidist.data.file_reader import BlockSizes, FileReader

__all__ = ["Dataset", "FileReader", "BlockSizes", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY",
           "SHARD_HINT", "IterationContext", "iterate", "static_batch_size", "source_row_count",
           "find_file_reader", "file_count", "file_shard_units", "source_units",
           "order_units", "has_shard_hints", "stack_elements", "specs_match"]

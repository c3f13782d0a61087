"""Input pipelines: ``mpidist.data.Dataset`` (the tf.data subset the guides use) and how
datasets are split across replicas and workers (``experimental_distribute_dataset``)."""

from mpidist.data import experimental
from mpidist.data.dataset import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset
from mpidist.data.ops import (  # noqa: F401  # each registers its operations
    batch,
    batching,
    cache,
    concatenate,
    filter,
    grouping,
    ignore_errors,
    interleave,
    map,
    prefetch,
    row_order,
    sampling,
    scan,
    sources,
    window,
    zip,
)
from mpidist.data.options import Options
from mpidist.data.readers import HDF5Dataset, NpyDataset, NpzDataset, ParquetDataset, TextLineDataset
from mpidist.data.spec import TensorSpec
from mpidist.data.tfrecord import TFRecordDataset

__all__ = ["AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "Dataset", "Options",
           "TensorSpec", "experimental", "TextLineDataset", "NpyDataset", "NpzDataset", "ParquetDataset",
           "HDF5Dataset", "TFRecordDataset"]

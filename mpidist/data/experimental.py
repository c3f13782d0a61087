"""``mpidist.data.experimental``: the names tf.data keeps under ``experimental``."""

from mpidist.data.csv_reader import CsvDataset, make_csv_dataset
from mpidist.data.dataset import AUTOTUNE, INFINITE_CARDINALITY, SHARD_HINT, UNKNOWN_CARDINALITY
from mpidist.data.distributed import Optional
from mpidist.data.options import AutoShardPolicy, DistributeOptions

__all__ = ["AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "SHARD_HINT", "AutoShardPolicy",
           "DistributeOptions", "Optional", "CsvDataset", "make_csv_dataset"]

"""``mpidist.io``: the parts of ``tf.io`` an input pipeline needs, without TensorFlow.

- TFRecord files: ``TFRecordWriter``, ``TFRecordOptions``, ``TFRecordCompressionType``
  (``mpidist.data.TFRecordDataset`` reads them).
- ``tf.train.Example``: the feature specs ``FixedLenFeature``, ``VarLenFeature``,
  ``FixedLenSequenceFeature``; ``parse_single_example`` and ``parse_example``; sparse values
  as ``SparseTensor`` (``sparse_to_dense``); ``encode_example`` / ``decode_example`` to write
  and inspect records; the messages themselves under ``mpidist.io.train`` (``Example``,
  ``Features``, ``Feature``, ``BytesList``, ``FloatList``, ``Int64List``), as ``tf.train``
  names them.
"""

from types import SimpleNamespace

from mpidist.io.example import (
    BytesList,
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    FixedLenFeature,
    FixedLenSequenceFeature,
    FloatList,
    Int64List,
    SequenceExample,
    SparseTensor,
    VarLenFeature,
    decode_example,
    encode_example,
    parse_example,
    parse_single_example,
    sparse_to_dense,
)
from mpidist.io.tfrecord import TFRecordCompressionType, TFRecordOptions, TFRecordWriter

# tf.train's message classes, under the name TF users write (mpidist.io.train.Example(...)).
train = SimpleNamespace(Example=Example, Features=Features, Feature=Feature, BytesList=BytesList,
                        FloatList=FloatList, Int64List=Int64List, FeatureList=FeatureList,
                        FeatureLists=FeatureLists, SequenceExample=SequenceExample)

__all__ = ["FixedLenFeature", "VarLenFeature", "FixedLenSequenceFeature", "SparseTensor",
           "sparse_to_dense", "parse_single_example", "parse_example", "encode_example",
           "decode_example", "TFRecordWriter", "TFRecordOptions", "TFRecordCompressionType", "train"]

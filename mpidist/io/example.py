"""``tf.train.Example`` without TensorFlow: the messages, the feature specs
(``FixedLenFeature``, ``VarLenFeature``, ``FixedLenSequenceFeature``), ``parse_single_example``,
``parse_example`` and ``encode_example`` to write them.

The messages are TF's own (``tensorflow/core/example/{example,feature}.proto``, same package
and field numbers, so the bytes are the same), built at import from a descriptor in a private
descriptor pool (no conflict with TensorFlow's if both are imported) and parsed by the
``protobuf`` package's C parser (upb).

Why protobuf rather than decoding the wire format in Python: on 100k small examples (a 4-float,
a 1-int64 and a 1-bytes feature, 64 bytes each), parsing with protobuf and reading the three
value lists took 5.1 us per example, a hand-written Python wire decoder 10.4 us (and it was not
yet general); protobuf's parse alone is 1.2 us. Measured with protobuf 7.36 (upb), Python 3.11.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from mpidist.errors import InvalidArgumentError

__all__ = ["Example", "Features", "Feature", "BytesList", "FloatList", "Int64List",
           "FixedLenFeature", "VarLenFeature", "FixedLenSequenceFeature", "SparseTensor",
           "parse_single_example", "parse_example", "encode_example", "decode_example"]


# -- the messages --------------------------------------------------------------------------------
def _build_messages() -> dict[str, Any]:
    F = descriptor_pb2.FieldDescriptorProto  # noqa: N806  # protobuf's name
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/example.proto", package="tensorflow", syntax="proto3")

    def message(name: str) -> Any:
        return proto.message_type.add(name=name)

    def field(m: Any, name: str, number: int, kind: int, repeated: bool = False,
              type_name: str | None = None, packed: bool = False) -> Any:
        f = m.field.add(name=name, number=number, type=kind,
                        label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
        if packed:
            f.options.packed = True
        return f

    def string_map(m: Any, name: str, entry: str, value_type: str) -> None:
        """A ``map<string, value_type>`` field ``name`` of message ``m``, as protoc writes one:
        a nested ``entry`` message of key and value, repeated."""
        pair = m.nested_type.add(name=entry)
        pair.options.map_entry = True
        field(pair, "key", 1, F.TYPE_STRING)
        field(pair, "value", 2, F.TYPE_MESSAGE, type_name=f".tensorflow.{value_type}")
        field(m, name, 1, F.TYPE_MESSAGE, repeated=True,
              type_name=f".tensorflow.{m.name}.{entry}")

    field(message("BytesList"), "value", 1, F.TYPE_BYTES, repeated=True)
    field(message("FloatList"), "value", 1, F.TYPE_FLOAT, repeated=True, packed=True)
    field(message("Int64List"), "value", 1, F.TYPE_INT64, repeated=True, packed=True)
    feature = message("Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
            (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1):
        field(feature, name, number, F.TYPE_MESSAGE, type_name=f".tensorflow.{type_name}").oneof_index = 0
    string_map(message("Features"), "feature", "FeatureEntry", "Feature")
    list_message = message("FeatureList")
    field(list_message, "feature", 1, F.TYPE_MESSAGE, repeated=True, type_name=".tensorflow.Feature")
    string_map(message("FeatureLists"), "feature_list", "FeatureListEntry", "FeatureList")
    field(message("Example"), "features", 1, F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    sequence = message("SequenceExample")
    field(sequence, "context", 1, F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    field(sequence, "feature_lists", 2, F.TYPE_MESSAGE, type_name=".tensorflow.FeatureLists")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    names = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList",
             "FeatureLists", "Example", "SequenceExample")
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{n}"))
            for n in names}


_MESSAGES = _build_messages()
BytesList = _MESSAGES["BytesList"]
FloatList = _MESSAGES["FloatList"]
Int64List = _MESSAGES["Int64List"]
Feature = _MESSAGES["Feature"]
Features = _MESSAGES["Features"]
FeatureList = _MESSAGES["FeatureList"]
FeatureLists = _MESSAGES["FeatureLists"]
Example = _MESSAGES["Example"]
SequenceExample = _MESSAGES["SequenceExample"]


# -- dtypes ----------------------------------------------------------------------------------------
# spec dtype name -> (the Feature kind holding it, the output NumPy dtype, TF's name in messages)
_KINDS: dict[str, tuple[str, np.dtype[Any], str]] = {"float32": ("float_list", np.dtype(np.float32), "float"),
          "int64": ("int64_list", np.dtype(np.int64), "int64"),
          "string": ("bytes_list", np.dtype(object), "string")}
_KIND_NAMES = {"float_list": "float", "int64_list": "int64", "bytes_list": "string"}


def _dtype_name(dtype: object, where: str) -> str:
    """"float32" / "int64" / "string" from the spellings TF and NumPy users write."""
    name = getattr(dtype, "name", None)  # a tf.DType (name "float32", "string") or np.dtype
    if isinstance(dtype, str):
        name = dtype
    elif name is None or not isinstance(name, str):
        try:
            name = np.dtype(dtype).name  # type: ignore[call-overload]
        except TypeError:
            name = None
    if isinstance(name, str) and name in ("float32", "int64", "string"):
        return str(name)
    if name in ("object", "bytes", "str") or (isinstance(name, str) and name.startswith(("bytes", "str"))):
        return "string"
    raise InvalidArgumentError(
        f"{where}: dtype must be float32, int64 or string (tf.float32 / np.float32 / "
        f"'float32', tf.int64 / np.int64 / 'int64', tf.string / 'string' / bytes), got {dtype!r}. "
        "tf.train.Example holds only these three; convert after parsing.")


# -- the feature specs -----------------------------------------------------------------------------
def _shape(shape: object, where: str, allow_unknown_first: bool = False) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if shape is None or not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidArgumentError(
            f"{where}: shape must be a list or tuple of non-negative ints (e.g. [] for a scalar, "
            f"[3] for 3 values), got {shape!r}.")
    return tuple(int(d) for d in shape)


def _as_values(value: Any, dtype: str) -> np.ndarray:
    """``value`` as a flat array of the spec's output dtype (str is UTF-8 encoded)."""
    if dtype == "string":
        items = np.asarray(value, dtype=object).reshape(-1)
        out = np.empty(len(items), dtype=object)
        for i, v in enumerate(items):
            if isinstance(v, str):
                v = v.encode("utf-8")
            if not isinstance(v, (bytes, np.bytes_)):
                raise TypeError(f"a string feature's value is bytes or str, got {v!r}")
            out[i] = bytes(v)
        return out
    return np.asarray(value, dtype=_KINDS[dtype][1]).reshape(-1)


class FixedLenFeature(NamedTuple):
    """``tf.io.FixedLenFeature``: a feature with exactly ``prod(shape)`` values, parsed to an
    array of ``shape``; ``default_value`` (of that shape) where an example lacks it, else a
    missing feature is an error."""

    shape: Any
    dtype: Any
    default_value: Any = None


class VarLenFeature(NamedTuple):
    """``tf.io.VarLenFeature``: any number of values, parsed to a ``SparseTensor``."""

    dtype: Any


class FixedLenSequenceFeature(NamedTuple):
    """``tf.io.FixedLenSequenceFeature``: a run of values, each of ``shape``, parsed to an array
    of shape ``(n,) + shape`` (``parse_example`` pads the batch to its longest run with
    ``default_value``, else 0 / b""). ``allow_missing`` must be True for tf.train.Example, as
    in TF."""

    shape: Any
    dtype: Any
    allow_missing: bool = False
    default_value: Any = None


class SparseTensor(NamedTuple):
    """A sparse value, with ``tf.sparse.SparseTensor``'s field names: ``indices`` (int64,
    [nnz, rank]), ``values`` ([nnz]) and ``dense_shape`` (int64, [rank])."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray


def sparse_to_dense(sparse: SparseTensor, default_value: Any = None) -> np.ndarray:
    """``tf.sparse.to_dense``: the dense array of ``sparse`` (``default_value`` elsewhere, 0 or
    b"" if None)."""
    values = np.asarray(sparse.values)
    shape = tuple(int(d) for d in np.asarray(sparse.dense_shape))
    fill = default_value if default_value is not None else (b"" if values.dtype == object else 0)
    out = np.full(shape, fill, dtype=values.dtype)
    if len(values):
        out[tuple(np.asarray(sparse.indices).T)] = values
    return out


class _Spec:
    """One feature's spec, checked and normalized."""

    __slots__ = ("key", "kind", "dtype", "field", "out_dtype", "shape", "size", "default",
                 "spec", "tf_type")

    def __init__(self, key: str, spec: object, where: str) -> None:
        self.key, self.spec = key, spec
        what = f"{where}: features[{key!r}]"
        if isinstance(spec, FixedLenFeature):
            self.kind = "fixed"
            self.dtype = _dtype_name(spec.dtype, what)
            self.shape = _shape(spec.shape, what)
        elif isinstance(spec, VarLenFeature):
            self.kind, self.dtype, self.shape = "var", _dtype_name(spec.dtype, what), ()
        elif isinstance(spec, FixedLenSequenceFeature):
            self.kind = "sequence"
            self.dtype = _dtype_name(spec.dtype, what)
            self.shape = _shape(spec.shape, what)
            if not spec.allow_missing:
                raise InvalidArgumentError(
                    f"{what}: a FixedLenSequenceFeature of a tf.train.Example needs "
                    "allow_missing=True (TF refuses it otherwise too); pass allow_missing=True.")
        else:
            raise TypeError(
                f"{what} must be a FixedLenFeature, VarLenFeature or FixedLenSequenceFeature, "
                f"got {spec!r}.")
        self.field, self.out_dtype, self.tf_type = _KINDS[self.dtype]
        self.size = math.prod(self.shape)
        self.default: np.ndarray | None = None
        default = getattr(spec, "default_value", None)
        if default is not None:
            try:
                values = _as_values(default, self.dtype)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(
                    f"{what}: default_value {default!r} is not of dtype {self.dtype}: {e}.") from e
            if self.kind == "fixed":
                if values.size != self.size:
                    raise InvalidArgumentError(
                        f"{what}: default_value has {values.size} values, but shape "
                        f"{list(self.shape)} holds {self.size}; give a default of that shape.")
                self.default = values.reshape(self.shape)
            else:  # the padding of FixedLenSequenceFeature: one value
                if values.size != 1:
                    raise InvalidArgumentError(
                        f"{what}: default_value (the padding) must be one value, got "
                        f"{default!r}.")
                self.default = values

    def describe(self) -> str:
        return f"{type(self.spec).__name__}(shape={list(self.shape)}, dtype={self.dtype})"


def _specs(features: object, where: str) -> list[_Spec]:
    if not isinstance(features, Mapping):
        raise TypeError(f"{where}: features must be a dict {{name: FixedLenFeature / "
                        f"VarLenFeature / FixedLenSequenceFeature}}, got {features!r}.")
    if not features:
        raise InvalidArgumentError(f"{where}: features is empty; name at least one feature.")
    for key in features:
        if not isinstance(key, str):
            raise TypeError(f"{where}: feature names are str, got {key!r}.")
    return [_Spec(k, v, where) for k, v in features.items()]


# -- parsing -----------------------------------------------------------------------------------------
def _record(value: Any, where: str) -> bytes:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("latin-1")  # a str holding bytes as code points
    raise TypeError(f"{where}: serialized must be the bytes of a tf.train.Example (a "
                    f"TFRecordDataset element), got {type(value).__name__}: {str(value)[:60]!r}.")


def _records(serialized: Any, where: str) -> list[bytes]:
    if isinstance(serialized, np.ndarray):
        if serialized.ndim != 1:
            raise InvalidArgumentError(
                f"{where}: serialized must be a 1-d batch of records (shape [batch]), got shape "
                f"{serialized.shape}; use parse_single_example for one record.")
        return [_record(v, where) for v in serialized]
    if isinstance(serialized, (list, tuple)):
        return [_record(v, where) for v in serialized]
    raise InvalidArgumentError(
        f"{where}: serialized must be a batch of records (a list or 1-d array of bytes), got "
        f"{type(serialized).__name__}; use parse_single_example for one record.")


def _features_of(record: bytes, where: str, index: int | None, names: Sequence[str] | None) -> Any:
    try:
        return Example.FromString(record).features.feature
    except DecodeError as e:
        raise InvalidArgumentError(
            f"{where}: {_which(index, names)} is not a serialized tf.train.Example "
            f"({len(record)} bytes: {record[:16]!r}...): {e}. Check that the records are "
            "Examples (not SequenceExamples or another message).") from e


def _which(index: int | None, names: Sequence[str] | None) -> str:
    if index is None:
        return "the example" if not names else f"example {names[0]!r}"
    return f"example {index}" + (f" ({names[index]!r})" if names else "")


def _values(fmap: Any, spec: _Spec, where: str, index: int | None,
            names: Sequence[str] | None) -> Any:
    """The feature's value list (a protobuf repeated field), None if the example lacks it."""
    if spec.key not in fmap:
        return None
    feature = fmap[spec.key]
    kind = feature.WhichOneof("kind")
    if kind is None:  # a Feature with no list: no values, of any type
        return ()
    if kind != spec.field:
        values = getattr(feature, kind).value
        raise InvalidArgumentError(
            f"{where}: feature {spec.key!r} of {_which(index, names)} holds {len(values)} "
            f"{_KIND_NAMES[kind]} value(s) (a {kind}), but its spec {spec.describe()} reads "
            f"{spec.tf_type} values (a {spec.field}). Give the spec dtype "
            f"{_KIND_NAMES[kind] if kind != 'float_list' else 'float32'}, or write the feature as "
            f"{spec.tf_type}.")
    return getattr(feature, kind).value


def _missing(spec: _Spec, where: str, index: int | None, names: Sequence[str] | None,
             present: Iterable[str]) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{where}: feature {spec.key!r} ({spec.describe()}) is required but "
        f"{_which(index, names)} does not have it; it has {sorted(present)}. Give the spec a "
        "default_value, or use VarLenFeature / FixedLenSequenceFeature(allow_missing=True).")


def _wrong_length(spec: _Spec, got: int, where: str, index: int | None,
                  names: Sequence[str] | None) -> InvalidArgumentError:
    if spec.kind == "fixed":
        want = f"exactly {spec.size} (shape {list(spec.shape)})"
    else:
        want = f"a multiple of {spec.size} (runs of shape {list(spec.shape)})"
    return InvalidArgumentError(
        f"{where}: feature {spec.key!r} of {_which(index, names)} has {got} {spec.tf_type} "
        f"value(s), but its spec {spec.describe()} needs {want}. Fix the spec's shape, or "
        "use VarLenFeature for a varying count.")


def _to_array(values: Any, spec: _Spec) -> np.ndarray:
    if spec.dtype == "string":
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    return np.array(values, dtype=spec.out_dtype)


def _parse(records: list[bytes], specs: list[_Spec], where: str,
           names: Sequence[str] | None, single: bool) -> dict[str, Any]:
    columns: list[list[Any]] = [[] for _ in specs]
    for i, record in enumerate(records):
        index = None if single else i
        fmap = _features_of(record, where, index, names)
        for spec, column in zip(specs, columns):
            values = _values(fmap, spec, where, index, names)
            if values is None:
                if spec.kind == "fixed":
                    if spec.default is None:
                        raise _missing(spec, where, index, names, fmap.keys())
                    values = spec.default.reshape(-1)
                else:
                    values = ()
            n = len(values)
            if spec.kind == "fixed":
                wrong = n != spec.size
            elif spec.kind == "sequence":
                wrong = n % spec.size != 0 if spec.size else n != 0
            else:
                wrong = False
            if wrong:
                raise _wrong_length(spec, n, where, index, names)
            column.append(values)
    out: dict[str, Any] = {}
    batch = len(records)
    for spec, column in zip(specs, columns):
        if spec.kind == "fixed":
            array = _to_array(list(itertools.chain.from_iterable(column)), spec)
            out[spec.key] = array.reshape(spec.shape if single else (batch,) + spec.shape)
        elif spec.kind == "var":
            out[spec.key] = _sparse(column, spec, single)
        else:
            out[spec.key] = _sequence(column, spec, single)
    return out


def _sparse(column: list[Any], spec: _Spec, single: bool) -> SparseTensor:
    lengths = [len(v) for v in column]
    values = _to_array(list(itertools.chain.from_iterable(column)), spec)
    longest = max(lengths, default=0)
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths]) if lengths \
        else np.zeros(0, np.int64)
    if single:
        return SparseTensor(positions.reshape(-1, 1), values, np.array([longest], np.int64))
    rows = np.repeat(np.arange(len(column), dtype=np.int64), lengths)
    return SparseTensor(np.stack([rows, positions], axis=1).reshape(-1, 2), values,
                        np.array([len(column), longest], np.int64))


def _sequence(column: list[Any], spec: _Spec, single: bool) -> np.ndarray:
    if single:
        array = _to_array(list(column[0]), spec)
        return array.reshape((-1,) + spec.shape) if spec.size else np.zeros((0,) + spec.shape,
                                                                                spec.out_dtype)
    runs = [len(v) // spec.size if spec.size else 0 for v in column]
    longest = max(runs, default=0)
    if spec.default is not None:
        pad = spec.default[0]
    else:
        pad = b"" if spec.dtype == "string" else 0
    out = np.full((len(column), longest) + spec.shape, pad, dtype=spec.out_dtype)
    for i, (values, n) in enumerate(zip(column, runs)):
        if n:
            out[i, :n] = _to_array(values, spec).reshape((n,) + spec.shape)
    return out


def parse_single_example(serialized: Any, features: Mapping[str, Any],
                         example_names: Any = None, name: str | None = None) -> dict[str, Any]:
    """``tf.io.parse_single_example``: one serialized tf.train.Example (bytes, or a
    TFRecordDataset element) parsed into ``{name: value}`` as ``features`` specifies:
    FixedLenFeature → an array of its shape, VarLenFeature → a ``SparseTensor`` (indices
    [n, 1]), FixedLenSequenceFeature → an array of shape ``(n,) + shape``. float32, int64;
    string values are object arrays of bytes."""
    where = "parse_single_example"
    specs = _specs(features, where)
    names = None if example_names is None else [str(np.asarray(example_names).reshape(-1)[0])]
    return _parse([_record(serialized, where)], specs, where, names, single=True)


def parse_example(serialized: Any, features: Mapping[str, Any], example_names: Any = None,
                  name: str | None = None) -> dict[str, Any]:
    """``tf.io.parse_example``: a batch (list or 1-d array) of serialized tf.train.Examples
    parsed into ``{name: batched value}``: FixedLenFeature → [batch] + shape,
    VarLenFeature → a ``SparseTensor`` (indices [n, 2], dense_shape [batch, longest]),
    FixedLenSequenceFeature → [batch, longest run] + shape, padded with its
    ``default_value``."""
    where = "parse_example"
    specs = _specs(features, where)
    records = _records(serialized, where)
    names = None if example_names is None else [str(n) for n in np.asarray(example_names).reshape(-1)]
    if names is not None and len(names) != len(records):
        raise InvalidArgumentError(
            f"{where}: example_names has {len(names)} names for {len(records)} records; give one "
            "name per record, or None.")
    return _parse(records, specs, where, names, single=False)


# -- writing -----------------------------------------------------------------------------------------
def _feature(key: str, value: Any) -> Any:
    """A Feature message from a Python / NumPy value: bytes and str → bytes_list, floats →
    float_list, ints and bools → int64_list (lists and arrays of them too)."""
    if isinstance(value, Feature):
        return value
    if isinstance(value, (bytes, str, np.bytes_, np.str_)) or np.ndim(value) == 0:
        value = [value]
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        kind = flat.dtype.kind
        if kind == "f":
            return Feature(float_list=FloatList(value=flat.astype(np.float32).tolist()))
        if kind in "iub":
            return Feature(int64_list=Int64List(value=flat.astype(np.int64).tolist()))
        value = flat.tolist()
    items = list(value)
    if not items:
        raise InvalidArgumentError(
            f"encode_example: feature {key!r} is an empty list, whose type cannot be told; give "
            "an empty NumPy array of its dtype (np.zeros(0, np.float32)) or a Feature message.")
    if all(isinstance(v, (bytes, str, np.bytes_, np.str_)) for v in items):
        return Feature(bytes_list=BytesList(value=[v.encode("utf-8") if isinstance(v, str) else bytes(v)
                                                   for v in items]))
    if all(isinstance(v, (int, bool, np.integer, np.bool_)) for v in items):
        return Feature(int64_list=Int64List(value=[int(v) for v in items]))
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
           for v in items):
        return Feature(float_list=FloatList(value=[float(v) for v in items]))
    raise InvalidArgumentError(
        f"encode_example: feature {key!r} holds {items[:4]!r}: a feature is bytes / str, ints or "
        "floats (one kind per feature).")


def encode_example(features: Mapping[str, Any]) -> bytes:
    """The serialized ``tf.train.Example`` of ``{name: value}``, what
    ``tf.train.Example(features=tf.train.Features(feature={...})).SerializeToString()`` gives:
    bytes / str values become a bytes_list, floats (and float arrays) a float_list (as
    float32), ints and bools an int64_list; a scalar is a list of one. A ``Feature``
    message is taken as it is."""
    if not isinstance(features, Mapping):
        raise TypeError(f"encode_example: features must be a dict {{name: value}}, got "
                        f"{type(features).__name__}.")
    example = Example()
    fmap = example.features.feature
    for key, value in features.items():
        if not isinstance(key, str):
            raise TypeError(f"encode_example: feature names are str, got {key!r}.")
        fmap[key].CopyFrom(_feature(key, value))
    return bytes(example.SerializeToString(deterministic=True))


def decode_example(serialized: Any) -> dict[str, np.ndarray]:
    """Every feature of one serialized tf.train.Example as a flat array (float32, int64, or an
    object array of bytes): what is in a record, without a spec."""
    fmap = _features_of(_record(serialized, "decode_example"), "decode_example", None, None)
    out: dict[str, np.ndarray] = {}
    for key in fmap:
        feature = fmap[key]
        kind = feature.WhichOneof("kind")
        if kind is None:
            out[key] = np.zeros(0, np.float32)
            continue
        dtype = {"float_list": "float32", "int64_list": "int64", "bytes_list": "string"}[kind]
        spec = _Spec(key, VarLenFeature(dtype), "decode_example")
        out[key] = _to_array(getattr(feature, kind).value, spec)
    return out

"""The digits MLP trained from files: each worker reads only its own shard files.

The training set is written once as shard files (``.npy``, Parquet, or TFRecord files of
``tf.train.Example`` records, as a TensorFlow pipeline would have them) into a directory every
rank can read; training then streams them through ``Dataset.list_files(...).interleave(reader)``
and ``experimental_distribute_dataset`` / ``fit``, where AUTO sharding finds the reader and gives
each worker its own files (FILE sharding): no rank ever holds the whole dataset.

    python examples/digits_from_files.py --write-only --data-dir /tmp/digits-files
    mpiexec -n 2 python examples/digits_from_files.py --data-dir /tmp/digits-files
    mpiexec -n 2 python examples/digits_from_files.py --data-dir /tmp/digits-files --format parquet
    mpiexec -n 2 python examples/digits_from_files.py --data-dir /tmp/digits-files --format tfrecord

Where the files are missing, the chief writes them first. The chief prints the test accuracy
and how many training rows each worker read per epoch (every row exactly once over the job).
"""

import argparse
import json
import os

import numpy as np

import mpidist
from mpidist.data import AUTOTUNE, Dataset, NpyDataset, ParquetDataset, TFRecordDataset
from mpidist.io import FixedLenFeature, TFRecordWriter, encode_example, parse_example

from digits_mlp import GLOBAL_BATCH, MLP, load_digits, make_strategy

SHARDS = 6


def write_shards(directory, fmt):
    """The 1500 training rows as SHARDS files of uneven sizes: ``.npy`` files hold the 64
    features and the label as a 65th column; Parquet files hold columns ``x`` (a fixed-size
    list of 64 floats) and ``label``; TFRecord files one ``tf.train.Example`` per row, with
    the features ``x`` (64 floats) and ``label`` (an int64)."""
    (x, y), _ = load_digits()
    os.makedirs(directory, exist_ok=True)
    cuts = np.linspace(0, len(x), SHARDS + 1).astype(int) + np.array([0, 40, -30, 25, -10, 5, 0])
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        path = os.path.join(directory, f"train-{i:02d}.{fmt}")
        if fmt == "npy":
            np.save(path, np.column_stack([x[a:b], y[a:b]]))
        elif fmt == "tfrecord":
            with TFRecordWriter(path) as writer:
                for features, label in zip(x[a:b], y[a:b]):
                    writer.write(encode_example({"x": features, "label": int(label)}))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            features = pa.FixedSizeListArray.from_arrays(pa.array(x[a:b].ravel()), 64)
            pq.write_table(pa.table({"x": features, "label": y[a:b]}), path, row_group_size=128)


def training_data(directory, fmt):
    files = Dataset.list_files(os.path.join(directory, f"train-*.{fmt}"), seed=3)
    if fmt == "npy":
        rows = files.interleave(NpyDataset, cycle_length=2)
        split = lambda batch: (batch[:, :64], batch[:, 64].astype(np.int64))  # noqa: E731
    elif fmt == "tfrecord":  # records are parsed a batch at a time, as in TF's guides
        rows = files.interleave(TFRecordDataset, cycle_length=2)
        spec = {"x": FixedLenFeature([64], np.float32), "label": FixedLenFeature([], np.int64)}

        def split(batch):
            parsed = parse_example(batch, spec)
            return parsed["x"].astype(np.float64), parsed["label"]
    else:
        rows = files.interleave(lambda f: ParquetDataset(f, columns=["x", "label"]), cycle_length=2)
        split = lambda batch: (batch["x"], batch["label"])  # noqa: E731
    return rows.shuffle(256, seed=1).batch(GLOBAL_BATCH).map(split).prefetch(AUTOTUNE)


def have_shards(directory, fmt):
    return os.path.isdir(directory) and any(f.endswith(f".{fmt}") for f in os.listdir(directory))


def run(directory, fmt="npy", kind="multi-worker", replicas=1, epochs=5):
    """Train from the shard files; returns (test accuracy, training rows per epoch, strategy)."""
    strategy = make_strategy(kind, replicas)
    if not have_shards(directory, fmt):
        if strategy.extended.should_save_summary:  # the chief writes them; the others wait
            write_shards(directory, fmt)
        strategy.reduce("SUM", strategy.run(lambda: np.ones(1)), axis=None)  # a barrier
    with strategy.scope():
        model = MLP()
        optimizer = mpidist.optimizers.SGD(0.1, momentum=0.9)
        accuracy = mpidist.metrics.SparseCategoricalAccuracy()
    dist = strategy.experimental_distribute_dataset(training_data(directory, fmt))
    rows_per_epoch = []

    def step(x, y):
        per_example, grads, logits = model.loss_and_gradients(x, y)
        loss = mpidist.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        optimizer.apply_gradients(zip([g / GLOBAL_BATCH for g in grads], model.trainable_variables))
        return loss, np.array([float(len(y))])

    for _ in range(epochs):
        rows = 0.0
        for x, y in dist:
            _, count = strategy.run(step, args=(x, y))
            rows += float(strategy.reduce("SUM", count, axis=None)[0])
        rows_per_epoch.append(int(rows))
    _, test = load_digits()
    logs = mpidist.evaluate(model, Dataset.from_tensor_slices(test).batch(GLOBAL_BATCH),
                            strategy=strategy, metrics=[accuracy])
    return logs["sparse_categorical_accuracy"], rows_per_epoch, strategy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="digits-files")
    parser.add_argument("--format", default="npy", choices=["npy", "parquet", "tfrecord"])
    parser.add_argument("--write-only", action="store_true", help="write the shard files, exit")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.write_only:
        write_shards(args.data_dir, args.format)
        return
    accuracy, rows, strategy = run(args.data_dir, args.format, epochs=args.epochs)
    if strategy.extended.should_save_summary:
        if args.json:
            print(json.dumps({"accuracy": accuracy, "rows_per_epoch": rows,
                              "replicas": strategy.num_replicas_in_sync}))
        else:
            print(f"{args.format} files x{strategy.num_replicas_in_sync}: test accuracy "
                  f"{accuracy:.4f}; training rows per epoch {rows}")


if __name__ == "__main__":
    main()

"""The README's quick start and the examples run as written and train to the right answer."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import quickstart  # noqa: E402 - the examples folder is not a package


def readme_quick_start(index=1):
    """The quick start's python block number ``index`` (0: Keras, 1: NumPy arrays)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[index]


def test_readme_keras_quick_start_runs_as_written(tmp_path):
    script = tmp_path / "keras_quick_start.py"
    script.write_text(readme_quick_start(0))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    m = re.search(r"w = \[(.*)\] loss = (\S+)", out.stdout)
    assert m, out.stdout
    np.testing.assert_allclose(np.array(m.group(1).split(), dtype=float), [2.0, -3.0, 0.5], atol=2e-3)
    assert float(m.group(2)) < 1e-4


def test_readme_quick_start_runs_as_written(tmp_path):
    script = tmp_path / "quick_start.py"
    script.write_text(readme_quick_start())
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    m = re.search(r"w = \[(.*)\] b = (\S+) loss = (\S+)", out.stdout)
    assert m, out.stdout
    np.testing.assert_allclose(np.array(m.group(1).split(), dtype=float), [2.0, -3.0, 0.5], atol=2e-3)
    assert abs(float(m.group(2)) - 1.0) < 2e-3
    assert float(m.group(3)) < 1e-4


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_quickstart_example_converges_the_same_under_any_replica_count(replicas):
    w, b, loss = quickstart.main(["--replicas", str(replicas), "--steps", "100"])
    reference_w, reference_b, _ = quickstart.train(
        __import__("mpidist").OneDeviceStrategy("/cpu:0"), steps=100)
    np.testing.assert_allclose(w, quickstart.TRUE_W, atol=5e-3)
    assert abs(float(b) - quickstart.TRUE_B) < 5e-3
    assert loss < 1e-3
    # Same global batch and same data: the same weights within float rounding.
    np.testing.assert_allclose(w, reference_w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b, reference_b, rtol=1e-10, atol=1e-12)


def test_core_overhead_benchmark_runs_and_validates(capsys):
    """The benchmark stays runnable (it checks its reduce results before timing them)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import core_overhead

    rows = core_overhead.main(["--replicas", "2", "--sizes", "4 KiB", "--rounds", "1"])
    kinds = [row[0] for row in rows]
    assert kinds == ["dispatch", "reduce"]
    assert all(t > 0 for t in rows[1][3].values())
    assert "| 2 | 4 KiB |" in capsys.readouterr().out


def test_cross_device_ops_benchmark_runs_and_validates(capsys):
    """The CrossDeviceOps benchmark stays runnable; it validates each result before timing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cross_device_ops

    rows = cross_device_ops.main(["--replicas", "2", "--rounds", "1", "--quick"])
    kinds = [row[0] for row in rows]
    assert kinds == ["kernel", "reduce", "reduce", "batch"]
    assert rows[0][3] > 0 and rows[0][4] > 0
    assert rows[-1][2]["batch"] > 0 and rows[-1][2]["separate"] > 0
    out = capsys.readouterr().out
    assert "| 2 | 256 KiB |" in out and "batch_reduce_to" in out


@pytest.mark.parametrize("nprocs,replicas", [(2, 1), (2, 2), (4, 1)])
def test_quickstart_under_multi_worker_mirrored_matches_one_device(nprocs, replicas):
    """The example under mpiexec with MultiWorkerMirroredStrategy: only the chief prints, and
    the weights are those of one device with the same global batch."""
    from mpi_launch import launch

    argv = [str(ROOT / "examples" / "quickstart.py"), "--multi-worker", "--replicas",
            str(replicas), "--steps", "100", "--json"]
    code, out = launch(nprocs, argv, 180)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out  # the chief alone reports
    result = json.loads(lines[0])
    assert result["replicas"] == nprocs * replicas
    reference_w, reference_b, _ = quickstart.train(
        __import__("mpidist").OneDeviceStrategy("/cpu:0"), steps=100)
    np.testing.assert_allclose(result["w"], reference_w, rtol=1e-10, atol=1e-12)
    assert abs(result["b"] - float(reference_b)) < 1e-10
    assert result["loss"] < 1e-3


def test_multi_worker_benchmark_runs_and_validates():
    """The multi-worker benchmark stays runnable under mpiexec (it checks results first)."""
    from mpi_launch import launch

    code, out = launch(2, [str(ROOT / "benchmarks" / "multi_worker.py"), "--quick"], 240)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    assert "100 x 1000 float32: batch_reduce_to" in out and "256 KiB" in out


def test_input_pipeline_benchmark_runs_and_validates(capsys):
    """The input benchmark stays runnable; it checks every example is seen exactly once first."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import input_pipeline

    table = input_pipeline.main(["--quick"])
    assert [row[:2] for row in table] == [(32, 1), (32, 2), (256, 1), (256, 2)]
    assert all(min(row[2:]) > 0 for row in table)
    assert "global batch replicas/rank" in capsys.readouterr().out


def test_input_pipeline_benchmark_under_multi_worker():
    from mpi_launch import launch

    code, out = launch(2, [str(ROOT / "benchmarks" / "input_pipeline.py"), "--quick"], 240)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    assert "MultiWorkerMirroredStrategy, 2 rank(s)" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("32 ", "256 "))]) == 4


# -- examples/digits_mlp.py: a real model on a real dataset under every strategy -------------------
def _digits():
    sys.path.insert(0, str(ROOT / "examples"))
    import digits_mlp

    return digits_mlp


@pytest.fixture(scope="module")
def digits_reference():
    accuracy, weights, _ = _digits().run("one-device", 1, "fit")
    return accuracy, weights


@pytest.mark.parametrize("kind, replicas, loop", [
    ("one-device", 1, "custom"), ("mirrored", 2, "fit"), ("mirrored", 3, "custom"),
    ("mirrored", 4, "fit"), ("mirrored", 4, "custom"),
    ("central-storage", 2, "fit"), ("central-storage", 3, "custom"),
])
def test_digits_same_model_under_every_strategy(digits_reference, kind, replicas, loop):
    ref_accuracy, ref_weights = digits_reference
    assert ref_accuracy > 0.95  # the model really learns the digits
    accuracy, weights, _ = _digits().run(kind, replicas, loop)
    assert accuracy == ref_accuracy
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("nprocs, replicas, loop", [(2, 1, "fit"), (2, 2, "custom"), (4, 1, "fit"),
                                                    (4, 1, "custom")])
def test_digits_under_multi_worker_mirrored(digits_reference, nprocs, replicas, loop):
    from mpi_launch import launch

    argv = [str(ROOT / "examples" / "digits_mlp.py"), "--strategy", "multi-worker",
            "--replicas", str(replicas), "--loop", loop, "--json"]
    code, out = launch(nprocs, argv, 240)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out  # the chief alone reports
    result = json.loads(lines[0])
    assert result["replicas"] == nprocs * replicas
    ref_accuracy, ref_weights = digits_reference
    assert result["accuracy"] == ref_accuracy
    for got, want in zip(result["weights"], ref_weights):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-12)


def test_digits_prints_progress_on_the_chief_only():
    from mpi_launch import launch

    code, out = launch(2, [str(ROOT / "examples" / "digits_mlp.py"), "--strategy", "multi-worker",
                           "--epochs", "2"], 240)
    assert code == 0, out
    assert out.count("Epoch 1/2 - loss:") == 1 and out.count("Epoch 2/2 - loss:") == 1
    assert out.count("test accuracy") == 1


def test_training_step_benchmark_runs(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import training_step

    rows = training_step.main(["--quick"])
    assert [r[0] for r in rows] == ["OneDevice", "Mirrored x2"]
    assert rows[0][3] == 0.0 and rows[1][3] > 0  # one replica never communicates
    assert all(0 < r[3] < r[2] for r in rows[1:])
    assert "comm %" in capsys.readouterr().out


def test_training_step_benchmark_under_multi_worker():
    from mpi_launch import launch

    code, out = launch(2, [str(ROOT / "benchmarks" / "training_step.py"), "--quick"], 240)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    row = re.search(r"MWMS 2x1\s+32\s+(\S+)\s+(\S+)", out)
    assert row, out
    step_ms, comm_ms = map(float, row.groups())
    # The clock finds the reduction: one replica per rank still communicates every step.
    assert 0 < comm_ms < step_ms, out


# -- examples/custom_training_autograd.py and conv_jax.py: gradients from autodiff backends ------
# example: (the extra it needs, epochs, test accuracy it must pass, weight tolerance against
# OneDevice, how far the test accuracy may move). The float64 autograd MLP agrees to 1e-15;
# the float32 JAX network to about 2e-7 after 3 epochs, and a prediction on the edge could flip.
AUTODIFF_EXAMPLES = {
    "custom_training_autograd": ("autograd", 3, 0.93, {"rtol": 1e-9, "atol": 1e-12}, 0.0),
    "conv_jax": ("jax", 3, 0.93, {"rtol": 1e-4, "atol": 1e-5}, 1.5 / 297),
}


@pytest.fixture(scope="module", params=sorted(AUTODIFF_EXAMPLES))
def autodiff_example(request):
    """``(name, module, OneDevice accuracy, OneDevice weights)`` of each example, trained once."""
    import importlib

    name = request.param
    extra, epochs = AUTODIFF_EXAMPLES[name][:2]
    pytest.importorskip(extra, reason=f"examples/{name}.py needs the {extra} extra "
                                      f"(pip install 'mpidist[{extra}]')")
    module = importlib.import_module(name)  # examples/ is on sys.path (top of this file)
    accuracy, weights, _ = module.run("one-device", 1, epochs)
    return name, module, accuracy, weights


def _same_training(name, accuracy, weights, ref_accuracy, ref_weights):
    _, _, _, tolerance, accuracy_slack = AUTODIFF_EXAMPLES[name]
    assert abs(accuracy - ref_accuracy) <= accuracy_slack, (accuracy, ref_accuracy)
    assert len(weights) == len(ref_weights)
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(np.asarray(got), want, **tolerance)


def test_autodiff_example_learns_the_digits(autodiff_example):
    name, _, accuracy, _ = autodiff_example
    assert accuracy > AUTODIFF_EXAMPLES[name][2]


def test_autodiff_example_same_weights_under_mirrored(autodiff_example):
    name, module, ref_accuracy, ref_weights = autodiff_example
    accuracy, weights, strategy = module.run("mirrored", 2, AUTODIFF_EXAMPLES[name][1])
    assert strategy.num_replicas_in_sync == 2
    _same_training(name, accuracy, weights, ref_accuracy, ref_weights)


def test_autodiff_example_same_weights_under_multi_worker_mirrored(autodiff_example):
    from mpi_launch import launch

    name, _, ref_accuracy, ref_weights = autodiff_example
    argv = [str(ROOT / "examples" / f"{name}.py"), "--strategy", "multi-worker", "--replicas",
            "1", "--epochs", str(AUTODIFF_EXAMPLES[name][1]), "--json"]
    code, out = launch(2, argv, 180)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out  # the chief alone reports
    result = json.loads(lines[0])
    assert result["replicas"] == 2
    _same_training(name, result["accuracy"], result["weights"], ref_accuracy, ref_weights)


def test_custom_training_autograd_reports_and_checkpoints_every_epoch(tmp_path):
    """The tutorial's per-epoch line, and a checkpoint per epoch that restores the final
    weights into a fresh model under another strategy."""
    pytest.importorskip("autograd", reason="examples/custom_training_autograd.py needs the "
                                           "autograd extra (pip install 'mpidist[autograd]')")
    import custom_training_autograd as example
    import mpidist

    lines = []
    _, weights, _ = example.run("mirrored", 2, 2, checkpoint_dir=str(tmp_path),
                                report=lines.append)
    assert len(lines) == 2, lines
    for epoch, line in enumerate(lines, 1):
        assert re.fullmatch(rf"Epoch {epoch}, Loss: [\d.]+, Accuracy: [\d.]+, "
                            r"Test Loss: [\d.]+, Test Accuracy: [\d.]+", line), line
    latest = mpidist.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("ckpt-2")
    with mpidist.OneDeviceStrategy("/cpu:0").scope():
        fresh = example.Classifier(seed=1)
    mpidist.train.Checkpoint(model=fresh).restore(latest)
    for got, want in zip(fresh.trainable_variables, weights):
        np.testing.assert_array_equal(got.numpy(), want)


# -- examples/digits_from_files.py: training from shard files, each worker reading its own ------
@pytest.mark.parametrize("fmt", ["npy", "parquet", "tfrecord"])
def test_digits_from_files_under_multi_worker_mirrored(tmp_path, fmt):
    from mpi_launch import launch

    script = str(ROOT / "examples" / "digits_from_files.py")
    data = str(tmp_path / "shards")
    code, out = launch(1, [script, "--write-only", "--data-dir", data, "--format", fmt], 120)
    assert code == 0, out
    assert len(list((tmp_path / "shards").glob(f"train-*.{fmt}"))) == 6
    code, out = launch(2, [script, "--data-dir", data, "--format", fmt, "--json"], 240)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out  # the chief alone reports
    result = json.loads(lines[0])
    assert result["replicas"] == 2
    assert result["rows_per_epoch"] == [1500] * 5  # every row exactly once per epoch
    assert result["accuracy"] > 0.95


def test_keras_multi_worker_tutorial_at_two_ranks(tmp_path):
    """TF's multi-worker Keras tutorial, ported (examples/keras_multi_worker.py), at 2 ranks:
    it learns, the chief alone writes the checkpoints, and the model it saves loads in plain
    Keras (no strategy) and scores what the job reported."""
    from mpi_launch import launch

    code, out = launch(2, [str(ROOT / "examples" / "keras_multi_worker.py"), "--dir",
                           str(tmp_path)], 240)
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out  # the chief's line only
    report = json.loads(lines[0])
    assert report["workers"] == 2 and report["epochs"] == 3
    assert report["loss"][-1] < report["loss"][0] / 3
    assert report["test_accuracy"] > 0.9
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "weights.01.weights.h5", "weights.02.weights.h5", "weights.03.weights.h5"]
    assert not (tmp_path / "backup").exists()  # BackupAndRestore removes it at the end
    program = (
        "import os, sys, json; os.environ['KERAS_BACKEND'] = 'jax'\n"
        f"sys.path.insert(0, {str(ROOT / 'examples')!r})\n"
        "import keras, keras_multi_worker as k\n"
        f"model = keras.saving.load_model({report['model']!r})\n"
        "_, (x, y) = k.digits()\n"
        "print(json.dumps(model.evaluate(x, y, verbose=0)))\n")
    loaded = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    test_loss, test_accuracy = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert abs(test_accuracy - report["test_accuracy"]) < 1e-6
    assert abs(test_loss - report["test_loss"]) < 1e-4


def _equinox_weights(report):
    return [np.asarray(w) for w in report["weights"]]


def test_equinox_optax_example_same_weights_in_one_process_and_at_two_ranks():
    """examples/equinox_optax.py: an Equinox model and optax under OneDevice, Mirrored (2 CPU
    devices) and MWMS at 2 ranks ends with the same weights, and learns the digits."""
    from mpi_launch import launch

    def run(argv):
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "equinox_optax.py"),
                              "--json", "--epochs", "3"] + argv, capture_output=True,
                             text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    one, mirrored = run([]), run(["--replicas", "2"])
    code, out = launch(2, [str(ROOT / "examples" / "equinox_optax.py"), "--json", "--epochs",
                           "3", "--multi-worker"], 240)
    assert code == 0, out
    ranks = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert (one["replicas"], mirrored["replicas"], ranks["replicas"]) == (1, 2, 2)
    assert one["accuracy"] > 0.9
    for report in (mirrored, ranks):
        for got, want in zip(_equinox_weights(report), _equinox_weights(one)):
            np.testing.assert_allclose(got, want, atol=1e-5)

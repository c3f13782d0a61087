"""benchmarks/autodiff.py stays runnable and its gradient check keeps meaning something: every
way (hand-written, autograd, JAX, JAX with a jitted loss, and the libraries called directly) runs one tiny round
on both models after agreeing with the hand-written gradients. Ways whose library is missing
are skipped."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import mpidist

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark():
    # Under its own name: a bare "autodiff" would be ambiguous on sys.path.
    spec = importlib.util.spec_from_file_location("autodiff_benchmark",
                                                  ROOT / "benchmarks" / "autodiff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def _require(way):
    library = bench.library_of(way)
    if library is not None:
        pytest.importorskip(library)


@pytest.mark.parametrize("way", [w for w in bench.WAYS if w != "hand"])
def test_each_way_checks_its_gradients_and_times_one_round(way):
    _require(way)
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with bench.jax_x64():
        for model, dtype in (("digits", "float64"), ("digits", "float32"), ("deep", "float64")):
            times = bench.measure(strategy, None, bench.MODELS[model], dtype, ["hand", way],
                                  rounds=1, min_time=0.0)
            assert set(times) == {"hand", way}
            assert all(t > 0 for parts in times.values() for t in parts.values())


def test_deep_model_has_100_variables():
    with mpidist.OneDeviceStrategy("/cpu:0").scope():
        model = bench.MLP(bench.MODELS["deep"], "float32")
    assert len(model.trainable_variables) == 100


def test_digits_hand_written_model_is_the_examples():
    """The digits case starts from the example's weights and computes its gradients."""
    import digits_mlp  # on sys.path once the benchmark is loaded

    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        ours = bench.MLP(bench.MODELS["digits"], "float64")
        theirs = digits_mlp.MLP(hidden=32, seed=0)
    rng = np.random.default_rng(3)
    x, y = rng.random((16, 64)), rng.integers(0, 10, 16)
    for a, b in zip(ours.trainable_variables, theirs.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    loss_ours, grads_ours = strategy.run(ours.loss_and_gradients, args=(x, y))
    loss_theirs, grads_theirs, _ = strategy.run(theirs.loss_and_gradients, args=(x, y))
    np.testing.assert_allclose(loss_ours, loss_theirs, rtol=1e-12)
    for a, b in zip(grads_ours, grads_theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_gradient_check_catches_a_wrong_gradient():
    _require("autograd")
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    widths = bench.MODELS["digits"]
    args = bench.batch(strategy, widths, "float64")
    steps = {way: bench.make_case(strategy, widths, "float64", way)
             for way in ("hand", "autograd")}
    grads_of, train = steps["autograd"]
    steps["autograd"] = (lambda x, y: [g * 1.001 for g in grads_of(x, y)], train)
    with pytest.raises(AssertionError, match="autograd: gradient 0"):
        bench.check_gradients(strategy, steps, args, "float64")


def test_main_prints_every_way_and_restores_jax_64_bit_mode(capsys):
    jax = pytest.importorskip("jax")
    before = jax.config.read("jax_enable_x64")
    rows = bench.main(["--quick", "--rounds", "1", "--models", "digits", "--dtypes", "float32",
                       "--ways", "hand", "jax"])
    assert jax.config.read("jax_enable_x64") == before
    assert [row[3] for row in rows] == ["hand", "jax"]
    assert "| digits | 4 | float32 | jax |" in capsys.readouterr().out

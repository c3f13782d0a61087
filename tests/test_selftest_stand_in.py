"""The steps of ``mpidist selftest --gpu`` rehearsed without a GPU (``--stand-in cpu``): the
same step code with NumPy on ``/cpu:0``, the kernels in Numba's CUDA simulator, the 2-rank step
under mpiexec. This tests the steps themselves (their use of the public API, their checks and
their reports) before a GPU ever runs them; it never claims that a GPU ran. About 50 s.

Also ``mpidist bench gpu``: the stand-in's rows, and the error without a GPU."""

import json
import os
import subprocess
import sys

import pytest

from mpidist.cli import bench_gpu, selftest

PY = sys.executable


def _env():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    path = tmp_path_factory.mktemp("stand-in") / "report.json"
    proc = subprocess.run([PY, "-m", "mpidist", "selftest", "--gpu", "--stand-in", "cpu",
                           "--report", str(path)], env=_env(), capture_output=True, text=True,
                          timeout=400)
    return proc, json.loads(path.read_text())


@pytest.mark.timeout(420)
def test_every_step_passes_on_the_cpu_stand_in(rehearsal):
    proc, report = rehearsal
    failed = {s["name"]: s["detail"] for s in report["steps"] if s["status"] != "pass"}
    assert not failed, json.dumps(failed, indent=1)[-6000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["mode"] == "stand-in"
    assert proc.stdout.startswith("mpidist selftest --gpu: STAND-IN:")
    assert "nothing ran on a GPU" in report["headline"]
    assert [s["name"] for s in report["steps"]] == [s.name for s in selftest.STEPS]
    assert report["seconds"] < selftest.BUDGET_S


def test_the_steps_report_their_numbers(rehearsal):
    _, report = rehearsal
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["kernels"]["detail"]["checks"] > 60
    assert steps["kernels"]["detail"]["failed"] == 0
    assert steps["mirrored"]["detail"]["checks"] == 10
    assert steps["nccl"]["detail"]["checks"] == 21  # 7 dtypes x (all_reduce + 2 batch)
    ranks = steps["mwms_2_ranks"]["detail"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["size"] == 2 for r in ranks)
    assert all(r["nccl_across_ranks"] == "off" for r in ranks)  # CPU replicas: MPI
    assert steps["prefetch"]["detail"]["batches"] == 5
    assert steps["optimizers"]["detail"] == {"checks": 30, "ulp_differences": {}}
    for jit in ("jit=False", "jit=True"):
        assert steps["autodiff_jax"]["detail"][jit]["grad_rel_error"] < 1e-4
    assert steps["checkpoint"]["detail"]["checks"] == 2
    rows = steps["bench"]["detail"]["rows"]
    assert {r["impl"] for r in rows} == {"mpidist_run_all_reduce", "mpidist_nccl_all_reduce",
                                         "raw_copy"}
    assert all(r["time_us"] > 0 for r in rows)


def test_bench_gpu_stand_in_rows_and_ratios():
    proc = subprocess.run([PY, "-m", "mpidist", "bench", "gpu", "--stand-in", "cpu", "--quick",
                           "--sizes", "4K,64K", "--json"], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["benchmark"] == "gpu" and out["job"]["gpu"] is False
    assert out["job"]["baseline"] == "raw_copy" and out["job"]["rounds"] == 3
    rows = out["rows"]
    assert sorted({r["size_bytes"] for r in rows}) == [4096, 65536]
    for r in rows:
        base = next(b for b in rows if b["size_bytes"] == r["size_bytes"]
                    and b["impl"] == "raw_copy")
        assert r["ratio"] == pytest.approx(r["time_us"] / base["time_us"])
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_us"] / 1e3)
        assert r["time_min_us"] <= r["time_us"] <= r["time_max_us"]


def test_bench_gpu_without_a_gpu_says_so():
    proc = subprocess.run([PY, "-m", "mpidist", "bench", "gpu", "--quick"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "mpidist bench gpu needs a GPU" in proc.stderr


def test_device_timer_synchronizes_around_every_sample_and_interleaves():
    events = []
    timer = bench_gpu.DeviceTimer(lambda: events.append("sync"), min_time=1e-4, warmup=1,
                                  rounds=4)
    stats = timer.compare({"a": lambda: events.append("a"), "b": lambda: events.append("b")},
                          calibrate_with="b")
    calls = stats["a"]["calls"]
    assert stats["b"]["calls"] == calls and len(stats["a"]["samples"]) == 4
    timed = events[-4 * 2 * (calls + 2):]  # 4 rounds x 2 impls x (sync, calls, sync)
    order = [timed[i * (calls + 2) + 1] for i in range(8)]
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    for i in range(8):
        sample = timed[i * (calls + 2):(i + 1) * (calls + 2)]
        assert sample[0] == sample[-1] == "sync"

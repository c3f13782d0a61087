"""The ``mpidist`` command: ``info`` and ``bench`` outputs parsed and checked, alone and under
mpiexec, plus bad arguments, the plot file and both entry points.

Every launch runs with a timeout (a hang fails the test instead of stalling the run). The
benchmarks use ``--quick`` (a 3-size sweep with 2 ms samples): the numbers are checked for
consistency (algbw = bytes / time, busbw = algbw * 2(n-1)/n, ratio = time / raw time), not
for speed.
"""

import csv
import io
import json
import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from mpi_launch import LOOPBACK_ENV, launch

from mpidist.cli import bench as cli_bench
from mpidist.cli import info as cli_info
from mpidist.cli.gpu_components import COMPONENTS
from mpidist.backend import cupy_backend

TIMEOUT = 60
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "SLURM_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPIDIST_")
QUICK_SIZES = [8, 4096, 262144]
CORES = os.cpu_count() or 1


# -- running the command ---------------------------------------------------------------------
def clean_env(**extra):
    """This environment without launcher (or mpidist) variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(LOOPBACK_ENV)
    env.update(extra)
    return env


def run_alone(*args, env=None, command=None):
    """``(returncode, stdout, stderr)`` of ``python -m mpidist args`` as one plain process."""
    cmd = command or [sys.executable, "-m", "mpidist"]
    try:
        proc = subprocess.run([*cmd, *map(str, args)], env=env or clean_env(), text=True,
                              capture_output=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"mpidist {' '.join(map(str, args))} hung; output so far:\n{err.output}")
    return proc.returncode, proc.stdout, proc.stderr


def run_mpi(nprocs, *args, program=("-m", "mpidist"), env=None):
    """``(returncode, output)`` of the command on ``nprocs`` ranks (stdout and stderr merged)."""
    code, out = launch(nprocs, [*program, *map(str, args)], TIMEOUT, env)
    assert code is not None, f"mpiexec -n {nprocs} mpidist {' '.join(map(str, args))} hung:\n{out}"
    return code, out


def json_from(out):
    """The JSON object the command printed (the first line that opens one)."""
    start = next((i for i, line in enumerate(out.splitlines(keepends=True))
                  if line.startswith("{")), None)
    assert start is not None, f"no JSON object in the output:\n{out}"
    text = "".join(out.splitlines(keepends=True)[start:])
    obj, _ = json.JSONDecoder().raw_decode(text)
    return obj


# -- info ------------------------------------------------------------------------------------
_TRUTH = {}


def mpi_truth():
    """The MPI library as mpi4py reports it, asked in a subprocess (importing mpi4py.MPI here
    would initialise MPI inside the test process)."""
    if not _TRUTH:
        code = ("import json, mpi4py; from mpi4py import MPI; v = MPI.Get_library_version(); "
                "n, ver = MPI.get_vendor(); print(json.dumps({'mpi4py': mpi4py.__version__, "
                "'library': v.splitlines()[0], 'full': v.strip(), "
                "'vendor': n + ' ' + '.'.join(map(str, ver))}))")
        out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                             text=True, timeout=TIMEOUT, check=True)
        _TRUTH.update(json.loads(out.stdout))
    return _TRUTH


def check_info_report(report, nprocs):
    assert report["ranks"] == nprocs
    assert report["nodes"] == 1
    per_rank = report["per_rank"]
    assert [f["rank"] for f in per_rank] == list(range(nprocs))
    assert sorted(f["local_rank"] for f in per_rank) == list(range(nprocs))
    assert {f["local_size"] for f in per_rank} == {nprocs}
    assert {f["node_index"] for f in per_rank} == {0}
    assert {f["size"] for f in per_rank} == {nprocs}
    assert len({f["host"] for f in per_rank}) == 1 and report["hosts"] == [per_rank[0]["host"]]
    assert len({f["pid"] for f in per_rank}) == nprocs
    for f in per_rank:
        gpus = len(f["gpus"])
        assert f["device"] == (f"/gpu:{f['local_rank'] % gpus}" if gpus else "/cpu:0")
        assert f["launch_error"] is None
        assert f["cpu_count"] == CORES
        assert all(p["threads"] >= 1 for p in f["blas"])
    lib = report["library"]
    truth = mpi_truth()
    assert lib["mpi4py"] == truth["mpi4py"]
    assert lib["numpy"] == np.__version__
    assert lib["numba"] and lib["mpidist"] == __import__("mpidist").__version__
    assert lib["mpi"]["library"] == " ".join(truth["library"].split()), lib["mpi"]
    assert lib["mpi"]["library_version"] == truth["full"]
    assert lib["mpi"]["vendor"] == truth["vendor"]
    assert lib["mpi"]["thread_level"] in cli_info.THREAD_LEVELS
    assert lib["mpi"]["standard"].count(".") == 1
    assert lib["gpu_aware_mpi"]["enabled"] is False
    assert "nccl" in lib and lib["nccl_status"]
    assert [c["name"] for c in lib["gpu_components"]] == list(COMPONENTS)
    assert all(c["fix"] for c in lib["gpu_components"] if c["status"] != "ok")
    if lib["cupy"] is None:
        assert lib["nccl"] is None
    problems = report["problems"]
    if nprocs <= CORES:
        assert problems == [], problems
    else:
        assert [(p["kind"], p["severity"], p["ranks"]) for p in problems] == \
            [("oversubscribed", "warning", list(range(nprocs)))], problems


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_info_json_under_mpiexec(nprocs):
    code, out = run_mpi(nprocs, "info", "--json")
    assert code == 0, out
    check_info_report(json_from(out), nprocs)
    assert out.count('"per_rank"') == 1, "only rank 0 prints"


def test_info_alone_json_and_table():
    code, out, err = run_alone("info", "--json")
    assert code == 0, err
    report = json.loads(out)
    check_info_report(report, 1)
    assert report["per_rank"][0]["launcher"] == {}

    code, out, err = run_alone("info")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"mpidist {report['library']['mpidist']}: 1 rank(s) on 1 node(s) " \
                       f"({report['hosts'][0]})"
    fields = dict(line.split(None, 1) for line in lines[1:] if line[:1].isalpha()
                  and not line.startswith(("rank ", "Problems", "Launcher", "MPI ", "GPU-aware",
                                           "MPI library")))
    assert fields["Versions"].startswith(f"python {sys.version.split()[0]}, mpi4py ")
    assert any(line.startswith("MPI library     MPICH Version: ") for line in lines), out
    assert "Problems: none" in lines
    assert "Launcher (rank 0): none (started without a launcher)" in lines


def test_info_table_under_mpiexec_lists_every_rank():
    code, out = run_mpi(2, "info")
    assert code == 0, out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("rank  node  host"))
    rows = [line.split() for line in lines[head + 1:head + 3]]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [("0", "0", "0/2", "/cpu:0"),
                                                       ("1", "0", "1/2", "/cpu:0")], out
    assert "Problems: none" in lines, out
    assert any(line.startswith("Launcher (rank 0):") and "PMI_RANK=0" in line for line in lines)


@pytest.mark.parametrize("variable,tasks", [("PMI_SIZE", 2), ("SLURM_NTASKS", 3)])
def test_info_reports_singleton_ranks_without_crashing(variable, tasks):
    """A launcher announced N tasks but MPI started alone: info names the problem and the fix
    (exit status 1, as for any error-level problem) instead of raising."""
    code, out, err = run_alone("info", "--json", env=clean_env(**{variable: str(tasks)}))
    assert code == 1, (out, err)
    assert "Traceback" not in err, err
    report = json.loads(out)
    assert report["ranks"] == 1
    [problem] = report["problems"]
    assert problem["kind"] == "singleton-ranks" and problem["severity"] == "error"
    assert problem["ranks"] == [0]
    assert problem["message"].startswith(
        f"The launcher started {tasks} tasks ({variable}={tasks}) but MPI reports a world of "
        "size 1"), problem
    assert "srun --mpi=pmi2" in problem["fix"] and "srun --mpi=pmix" in problem["fix"] and "mpiexec" in problem["fix"]
    assert report["per_rank"][0]["launcher"][variable] == str(tasks)

    code, out, _ = run_alone("info", env=clean_env(**{variable: str(tasks)}))
    assert code == 1
    assert f"ERROR [singleton-ranks] ranks [0]: The launcher started {tasks} tasks" in out, out
    assert "    fix: under Slurm use `srun --mpi=pmi2` for MPICH" in out, out


def test_bench_refuses_singleton_ranks_with_the_fix():
    code, out, err = run_alone("bench", "allreduce", "--quick", env=clean_env(PMI_SIZE="2"))
    assert code == 1, (out, err)
    assert out == ""
    assert err.startswith("mpidist: error on rank 0 of 1 on "), err
    assert "RuntimeError: The launcher started 2 tasks (PMI_SIZE=2) but MPI reports a world of " \
           "size 1" in err and "srun --mpi=pmi2" in err, err


def rank(r, host="n1", device="/gpu:0", gpus=None, visible=None, local=None, cores=8, node=0):
    return {"rank": r, "size": 4, "host": host, "node_index": node, "local_rank": local or 0,
            "device": device, "gpus": gpus or [], "cuda_visible_devices": visible,
            "cpu_count": cores, "launch_error": None}


def gpu(i, uuid):
    return {"index": i, "name": "GPU", "uuid": uuid}


def test_find_problems_shared_gpu_by_uuid_visible_devices_and_index():
    two = [gpu(0, "GPU-a"), gpu(1, "GPU-b")]
    # Two ranks of one node both default to GPU-a; the third uses GPU-b.
    facts = [rank(0, device="/gpu:0", gpus=two), rank(1, device="/gpu:0", gpus=two),
             rank(2, device="/gpu:1", gpus=two)]
    [p] = cli_info.find_problems(facts)
    assert (p["kind"], p["severity"], p["ranks"]) == ("shared-gpu", "error", [0, 1])
    assert "GPU-a" in p["message"] and "n1" in p["message"]
    assert "one rank per GPU" in p["fix"]
    # One visible GPU per rank (CUDA_VISIBLE_DEVICES=$SLURM_LOCALID): all say /gpu:0, but the
    # UUIDs differ, so nothing is shared.
    facts = [rank(0, gpus=[gpu(0, "GPU-a")]), rank(1, gpus=[gpu(0, "GPU-b")])]
    assert cli_info.find_problems(facts) == []
    # Without UUIDs the CUDA_VISIBLE_DEVICES entries decide.
    facts = [rank(0, visible="0"), rank(1, visible="1"), rank(2, visible="1")]
    [p] = cli_info.find_problems(facts)
    assert p["ranks"] == [1, 2] and "CUDA_VISIBLE_DEVICES entry 1" in p["message"]
    # The same index on different hosts is different hardware; CPU devices never conflict.
    facts = [rank(0, host="n1"), rank(1, host="n2", node=1), rank(2, device="/cpu:0"),
             rank(3, device="/cpu:0")]
    assert cli_info.find_problems(facts) == []


def test_find_problems_oversubscription_launch_and_versions():
    facts = [rank(r, device="/cpu:0", cores=2) for r in range(3)] + \
        [rank(3, host="n2", node=1, device="/cpu:0", cores=2)]
    [p] = cli_info.find_problems(facts)
    assert (p["kind"], p["severity"], p["ranks"]) == ("oversubscribed", "warning", [0, 1, 2])
    assert "3 ranks run on n1, which has 2 cores" in p["message"]

    alone = dict(rank(0, device="/cpu:0"), size=1, launch_error=(
        "The launcher started 4 tasks (SLURM_NTASKS=4) but MPI reports a world of size 1 on "
        "this process: every task is running alone. Fix: use srun --mpi=pmix."))
    [p] = cli_info.find_problems([alone])
    assert p["kind"] == "singleton-ranks"
    assert p["message"].endswith("every task is running alone.")
    assert p["fix"] == "use srun --mpi=pmix."

    lib = {"mpidist": "0.1.0", "mpi4py": "4.1", "numpy": "2.0", "numba": "0.60", "cupy": None,
           "nccl": None, "mpi": {"library": "MPICH Version: 5.0.2"}}
    other = dict(lib, numpy="1.26", mpi={"library": "Open MPI v5.0.3"})
    facts = [rank(0, device="/cpu:0"), rank(1, device="/cpu:0")]
    assert cli_info.find_problems(facts, [lib, dict(lib)]) == []
    [p] = cli_info.find_problems(facts, [lib, other])
    assert p["kind"] == "version-mismatch" and "numpy, MPI library" in p["message"]


def test_gpu_facts_read_the_device_properties(monkeypatch):
    """The GPU listing (not runnable here without a GPU) against a stand-in CuPy runtime."""
    uuid = bytes(range(16))

    class Runtime:
        @staticmethod
        def getDeviceProperties(i):
            return {"name": b"NVIDIA H100", "uuid": uuid, "pciBusID": 0x1b + i,
                    "pciDeviceID": 0, "pciDomainID": 0, "totalGlobalMem": 80 * 2**30}

    fake = type("cupy", (), {"cuda": type("cuda", (), {"runtime": Runtime})})
    monkeypatch.setattr(cupy_backend, "get_cupy", lambda: fake)
    monkeypatch.setattr(cupy_backend, "gpu_count", lambda: 2)
    gpus, reason = cli_info.gpu_facts()
    assert reason is None
    assert gpus[1] == {"index": 1, "name": "NVIDIA H100",
                       "uuid": "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f",
                       "pci_bus_id": "0000:1c:00.0", "memory_gib": 80.0}


# -- bench: pure parts -----------------------------------------------------------------------
def test_sizes_units_and_bus_factor():
    assert cli_bench.parse_sizes("4K:64M") == [4096 << k for k in range(15)]
    assert cli_bench.parse_sizes("8:64M")[0] == 8 and cli_bench.parse_sizes("8:64M")[-1] == 64 << 20
    assert cli_bench.parse_sizes("1K:1M:4") == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert cli_bench.parse_sizes("1M,8,4KiB,8") == [8, 4096, 1 << 20]
    assert cli_bench.parse_size("2GB") == 2 << 30
    for bad in ("abc", "4X", "0", "1.5", "64M:4K", "4K:64M:1", "1:2:3:4", ","):
        with pytest.raises(ValueError):
            cli_bench.parse_sizes(bad)
    assert [cli_bench.human_size(s) for s in (8, 1024, 65536, 1 << 20, 64 << 20, 1536)] == \
        ["8B", "1K", "64K", "1M", "64M", "1536B"]
    assert [cli_bench.bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]


@pytest.mark.parametrize("dtype", cli_bench.DTYPES)
@pytest.mark.parametrize("op", cli_bench.OPS)
def test_expected_results_match_a_direct_reduction(dtype, op):
    for n in (1, 2, 3, 5):
        stack = np.stack([cli_bench.pattern(r, 50, dtype, op) for r in range(n)])
        direct = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0),
                  "prod": stack.prod(0)}[op].astype(dtype)
        np.testing.assert_array_equal(cli_bench.expected(n, 50, dtype, op), direct)
        assert len(set(direct.tolist())) > 1  # a pattern, not a constant


# -- bench allreduce -------------------------------------------------------------------------
def check_allreduce_rows(rows, nprocs, sizes, ops, dtype="float32"):
    itemsize = np.dtype(dtype).itemsize
    assert [(r["size_bytes"], r["op"], r["impl"]) for r in rows] == \
        [(s, op, impl) for s in sizes for op in ops for impl in ("raw", "mpidist")]
    for raw, ours in zip(rows[::2], rows[1::2]):
        for r in (raw, ours):
            assert r["count"] == r["size_bytes"] // itemsize and r["dtype"] == dtype
            assert r["calls"] >= 1
            assert 0 < r["time_min_us"] <= r["time_us"] <= r["time_max_us"]
            assert math.isclose(r["algbw_gbps"], r["size_bytes"] / r["time_us"] / 1e3,
                                rel_tol=1e-4)
            assert math.isclose(r["busbw_gbps"], r["algbw_gbps"] * 2 * (nprocs - 1) / nprocs,
                                rel_tol=1e-4, abs_tol=1e-12)
        assert raw["calls"] == ours["calls"], "both implementations run the agreed count"
        assert raw["ratio_to_raw"] == 1.0
        assert math.isclose(ours["ratio_to_raw"], ours["time_us"] / raw["time_us"], rel_tol=1e-4)


def png_chunks(path):
    """``[(type, data)]`` of a PNG file, checking its signature and every chunk's CRC."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        chunks.append((kind.decode(), body))
        pos += 12 + length
    assert chunks[0][0] == "IHDR" and chunks[-1][0] == "IEND"
    return chunks


def check_plot(path, report):
    """A real PNG of the expected size whose drawn lines are the JSON's numbers."""
    import matplotlib.image

    from mpidist.cli.plot import PNG_SERIES_KEY

    chunks = png_chunks(path)
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert (width, height) == (1200, 960)  # 8 x 6.4 inches at 150 dpi
    assert Path(path).stat().st_size > 20_000
    assert matplotlib.image.imread(path).shape[:2] == (960, 1200)
    texts = dict(body.split(b"\0", 1) for kind, body in chunks if kind == "tEXt")
    series = json.loads(texts[PNG_SERIES_KEY.encode()])
    nprocs = report["job"]["ranks"]
    rows = report["rows"]
    key = "busbw_gbps" if nprocs > 1 else "algbw_gbps"
    labels = {"mpidist": "mpidist Communicator.all_reduce", "raw": "raw mpi4py comm.Allreduce"}
    expected = {}
    for op in report["settings"]["ops"]:
        for impl in ("mpidist", "raw"):
            mine = sorted((r["size_bytes"], r[key]) for r in rows
                          if r["op"] == op and r["impl"] == impl)
            expected[(0, f"{labels[impl]} ({op})")] = mine
        ratio = sorted((r["size_bytes"], r["ratio_to_raw"]) for r in rows
                       if r["op"] == op and r["impl"] == "mpidist")
        expected[(1, f"mpidist / raw ({op})")] = ratio
    drawn = {(s["axes"], s["label"]): list(zip(s["x"], s["y"])) for s in series}
    assert set(drawn) == set(expected)
    for key_, points in expected.items():
        np.testing.assert_allclose(np.array(drawn[key_]), np.array(points, dtype=float),
                                   rtol=1e-9, err_msg=str(key_))
    assert texts[b"Software"].decode() == f"mpidist {report['job']['mpidist']}"
    title = texts[b"Title"].decode()
    assert f"{nprocs} rank" in title and report["job"]["mpi_vendor"] in title


def test_bench_allreduce_alone_json_and_plot(tmp_path):
    png = tmp_path / "allreduce.png"
    code, out, err = run_alone("bench", "allreduce", "--quick", "--json", "--plot", png)
    assert code == 0, err
    report = json.loads(out)
    assert report["benchmark"] == "allreduce"
    assert report["job"]["ranks"] == 1 and report["job"]["nodes"] == 1
    assert report["settings"]["sizes"] == QUICK_SIZES and report["settings"]["dtype"] == "float32"
    assert report["plot"] == str(png)
    rows = report["rows"]
    check_allreduce_rows(rows, 1, QUICK_SIZES, ["sum"])
    assert all(r["busbw_gbps"] == 0 for r in rows)  # nccl-tests: no bus traffic on one rank
    check_plot(png, report)


@pytest.mark.parametrize("nprocs", [2])
def test_bench_allreduce_json_and_plot_under_mpiexec(nprocs, tmp_path):
    png = tmp_path / "allreduce.png"
    code, out = run_mpi(nprocs, "bench", "allreduce", "--quick", "--ops", "sum,max", "--json",
                        "--plot", png)
    assert code == 0, out
    report = json_from(out)
    assert report["job"]["ranks"] == nprocs and report["job"]["ranks_per_node"] == nprocs
    check_allreduce_rows(report["rows"], nprocs, QUICK_SIZES, ["sum", "max"])
    assert all(r["busbw_gbps"] > 0 for r in report["rows"])
    check_plot(png, report)


def parse_table(out):
    """Data rows of the human table: ``[(size, count, dtype, op, t, algbw, busbw, raw t,
    raw algbw, raw busbw, ratio)]``, plus the comment lines."""
    rows, comments = [], []
    for line in out.splitlines():
        if line.startswith("#"):
            comments.append(line)
        elif line.strip():
            f = line.split()
            assert len(f) == 11, line
            rows.append((int(f[0]), int(f[1]), f[2], f[3], *map(float, f[4:])))
    return rows, comments


@pytest.mark.parametrize("nprocs", [1, 2])
def test_bench_allreduce_table(nprocs):
    if nprocs == 1:
        code, out, err = run_alone("bench", "allreduce", "--sizes", "64,1K", "--ops", "sum,min",
                                   "--dtype", "int64", "--iters", "20", "--rounds", "2",
                                   "--warmup", "0")
        assert code == 0, err
    else:
        code, out = run_mpi(nprocs, "bench", "allreduce", "--sizes", "64,1K", "--ops", "sum,min",
                            "--dtype", "int64", "--iters", "20", "--rounds", "2", "--warmup", "0")
        assert code == 0, out
    rows, comments = parse_table(out)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == \
        [(s, s // 8, "int64", op) for s in (64, 1024) for op in ("sum", "min")]
    factor = 2 * (nprocs - 1) / nprocs
    for size, _, _, _, t, algbw, busbw, raw_t, raw_algbw, raw_busbw, ratio in rows:
        assert math.isclose(algbw, size / t / 1e3, rel_tol=0.06, abs_tol=6e-5)
        assert math.isclose(busbw, algbw * factor, rel_tol=0.06, abs_tol=6e-5)
        assert math.isclose(raw_algbw, size / raw_t / 1e3, rel_tol=0.06, abs_tol=6e-5)
        assert math.isclose(raw_busbw, raw_algbw * factor, rel_tol=0.06, abs_tol=6e-5)
        assert math.isclose(ratio, t / raw_t, rel_tol=0.06, abs_tol=0.01)
    assert comments[0].startswith(f"# mpidist bench allreduce: {nprocs} rank(s) on 1 node(s)")
    assert "20 calls per sample" in out and "median over 2 interleaved rounds" in out
    assert f"busbw = algbw * 2(n-1)/n = algbw * {factor:.3f}" in out
    assert any(c.startswith("# mpidist / raw time: geometric mean ") for c in comments)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_bench_allreduce_csv(nprocs):
    args = ("bench", "allreduce", "--quick", "--ops", "prod", "--dtype", "float64", "--csv")
    if nprocs == 1:
        code, out, err = run_alone(*args)
        assert code == 0, err
    else:
        code, out = run_mpi(nprocs, *args)
        assert code == 0, out
    lines = out.splitlines()
    head = lines.index(",".join(cli_bench.CSV_COLUMNS))
    records = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    numeric = ("size_bytes", "count", "calls", "time_us", "time_min_us", "time_max_us",
               "algbw_gbps", "busbw_gbps", "ratio_to_raw")
    rows = [{k: (float(v) if k in numeric else v) for k, v in r.items()} for r in records]
    check_allreduce_rows(rows, nprocs, QUICK_SIZES, ["prod"], dtype="float64")


# -- bench batch ---------------------------------------------------------------------------
BATCH_IMPLS = ["raw pre-packed", "raw concat+split", "raw per-tensor", "mpidist batch_reduce_to"]


def test_bench_batch_json_under_mpiexec(tmp_path):
    png = tmp_path / "batch.png"
    code, out = run_mpi(2, "bench", "batch", "--quick", "--tensors", "20", "--tensor-size", "300",
                        "--json", "--plot", png)
    assert code == 0, out
    report = json_from(out)
    assert report["benchmark"] == "batch" and report["job"]["ranks"] == 2
    rows = report["rows"]
    assert [r["impl"] for r in rows] == BATCH_IMPLS
    base = rows[0]["time_us"]
    for r in rows:
        assert (r["tensors"], r["tensor_size"]) == (20, 300)
        assert (r["count"], r["size_bytes"]) == (6000, 24000)
        assert math.isclose(r["ratio_to_raw"], r["time_us"] / base, rel_tol=1e-9)
        assert math.isclose(r["time_per_tensor_us"], r["time_us"] / 20, rel_tol=1e-9)
        assert math.isclose(r["busbw_gbps"], r["algbw_gbps"], rel_tol=1e-9)  # n = 2
    assert len({r["calls"] for r in rows}) == 1
    assert png_chunks(png)[0][0] == "IHDR"


def test_bench_batch_table_alone():
    code, out, err = run_alone("bench", "batch", "--tensors", "10", "--tensor-size", "100",
                               "--iters", "10", "--rounds", "1", "--warmup", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("# mpidist bench batch: 1 rank(s) on 1 node(s)")
    assert "# 10 tensors x 100 float32 (4000 bytes) summed per call" in lines
    table = {}
    for line in lines:
        if not line.startswith("#"):
            name, numbers = line[:28].strip(), line[28:].split()
            assert len(numbers) == 5, line
            table[name] = [float(x) for x in numbers]
    assert list(table) == BATCH_IMPLS
    base = table["raw pre-packed"][0]
    for t, per_tensor, _, busbw, ratio in table.values():
        assert math.isclose(per_tensor, t / 10, rel_tol=0.06, abs_tol=0.01)
        assert busbw == 0
        assert math.isclose(ratio, t / base, rel_tol=0.06, abs_tol=0.01)
    assert lines[-1].startswith("# mpidist batch_reduce_to is ")


# -- bench step ----------------------------------------------------------------------------
def check_step_report(report, nprocs):
    """Every case of the quick sweep is there, with positive times and ratios (no speed)."""
    assert report["benchmark"] == "step" and report["job"]["ranks"] == nprocs
    labels = ["OneDevice", "Mirrored x2", "MWMS 1x1"] if nprocs == 1 else [f"MWMS {nprocs}x1"]
    rows = report["rows"]
    want = {(label, "allreduce", case) for label in labels for case in ("4K", "256K")}
    want |= {(label, "apply_gradients", f"{kind} {v}x{100_000 // v}")
             for label in labels for kind in ("sgd", "adam") for v in (10, 100)}
    want |= {(label, "fit", model) for label in labels for model in ("digits MLP", "20-layer MLP")}
    assert {(r["strategy"], r["path"], r["case"]) for r in rows} == want
    assert len(rows) == len(want)
    for r in rows:
        assert r["time_us"] > 0 and r["baseline_us"] > 0 and r["ratio"] > 0, r
        assert math.isclose(r["ratio"], r["time_us"] / r["baseline_us"], rel_tol=1e-9), r
        assert r["ranks"] == nprocs and r["nodes"] == 1
        if r["path"] == "apply_gradients":
            assert r["update_us"] > 0 and r["size_bytes"] == 400_000
            assert r["comm_us"] > 0 or r["strategy"] == "OneDevice"
        if r["path"] == "fit":
            assert r["step_ms"] > 0 and 0 <= r["comm_share"] < 1
            # the raw NumPy + mpi4py step beside it, timed the same way
            assert r["raw_step_ms"] > 0 and 0 <= r["raw_comm_share"] < 1
            assert math.isclose(r["step_x_raw"], r["step_ms"] / r["raw_step_ms"], rel_tol=1e-9)
            assert r["variables"] == {"digits MLP": 4, "20-layer MLP": 40}[r["model"]]
    replicas = {r["strategy"]: r["replicas"] for r in rows}
    assert replicas == ({"OneDevice": 1, "Mirrored x2": 2, "MWMS 1x1": 1} if nprocs == 1
                        else {f"MWMS {nprocs}x1": nprocs})


STEP_TIMEOUT = 300  # the quick sweep still trains two models under three strategies


@pytest.mark.parametrize("nprocs", [1, 2])
def test_bench_step_quick_json(nprocs):
    argv = ["-m", "mpidist", "bench", "step", "--quick", "--json"]
    if nprocs == 1:
        proc = subprocess.run([sys.executable, *argv], env=clean_env(), text=True,
                              capture_output=True, timeout=STEP_TIMEOUT, check=False)
        code, out = proc.returncode, proc.stdout + proc.stderr
    else:
        code, out = launch(nprocs, argv, STEP_TIMEOUT)
        assert code is not None, f"mpidist bench step hung at {nprocs} ranks:\n{out}"
    assert code == 0, out
    check_step_report(json_from(out), nprocs)


# -- bench keras ---------------------------------------------------------------------------
def test_bench_keras_runs_and_checks_its_paths_agree_at_two_ranks():
    """``mpidist bench keras`` at 2 ranks: every model's row, with positive times and ratios
    (no speed); it first checks that fit and the raw step end with the same weights."""
    code, out = launch(2, ["-m", "mpidist", "bench", "keras", "--steps", "2", "--rounds", "1",
                           "--json"], STEP_TIMEOUT)
    assert code == 0, out
    report = json_from(out)
    assert report["benchmark"] == "keras" and report["job"]["ranks"] == 2
    assert [r["model"] for r in report["rows"]] == ["MLP 784-1024-10", "CNN 28x28x1"]
    for r in report["rows"]:
        assert r["ranks"] == 2 and r["replicas"] == 2 and r["steps"] == 2
        assert r["step_ms"] > 0 and r["raw_step_ms"] > 0 and r["fit_call_ms"] >= r["step_ms"]
        assert math.isclose(r["x_raw"], r["step_ms"] / r["raw_step_ms"], rel_tol=1e-9)
    assert report["rows"][0]["parameters"] == 784 * 1024 + 1024 + 1024 * 10 + 10


def test_bench_step_markdown_fits_the_cost_model():
    from mpidist.cli import bench_step_report as report

    def ar(p, n, raw, ours):
        return {"path": "allreduce", "strategy": f"MWMS {p}x1", "ranks": p, "nodes": 1,
                "size_bytes": n, "case": cli_bench.human_size(n), "time_us": ours,
                "baseline_us": raw, "ratio": ours / raw, "baseline": "raw comm.Allreduce"}

    # raw = 2(p-1)*3 us + 2(p-1)/p * n / 2000 us (2 GB/s); mpidist adds 10 us per call
    rows = [ar(p, n, 6 * (p - 1) + (p - 1) / p * n / 1000, 6 * (p - 1) + (p - 1) / p * n / 1000
               + 10) for p in (2, 4) for n in (4096, 262144, 4 << 20)]
    rows += [{"path": "apply_gradients", "strategy": "MWMS 2x1", "ranks": 2, "nodes": 1,
              "optimizer": "sgd", "variables": v, "size_bytes": 400_000, "case": f"sgd {v}",
              "time_us": 500 + 100 + 30 * v, "baseline_us": 500, "ratio": 1.0,
              "update_us": 50.0, "comm_us": 450.0, "ratio_to_update": 1.0,
              "ratio_to_fused": 1.25 + v / 1000,
              "baseline": "raw Allreduce + NumPy update"} for v in (10, 100, 1000)]
    model = report.fit_cost_model(rows)
    net = model["one_node"]
    assert math.isclose(net["alpha_us"], 3.0, rel_tol=1e-6)
    assert math.isclose(net["gbps"], 2.0, rel_tol=1e-6)
    assert math.isclose(net["c_call_us"], 10.0, rel_tol=1e-6)
    terms = model["apply_gradients"]["MWMS 2x1 sgd"]
    assert math.isclose(terms["c_step_us"], 100, rel_tol=1e-6)
    assert math.isclose(terms["c_var_us"], 30, rel_tol=1e-6)
    (p100, *_) = report.project(model)
    # 64 ranks, measured network: 100 + 30*100 + 50 + 126*3 + 2*63/64*400000/2000
    assert math.isclose(p100["times_us"][0], 3150 + 378 + 126 / 64 * 200, rel_tol=1e-6)
    text = report.render_markdown([{"rows": rows}])
    assert "| MWMS 2x1 | sgd |" in text and "512 ranks" in text
    assert "(1.0x; 1.3x fused; 1x)" in text and "(1.0x; 2.2x fused; 1x)" in text
    # A report saved before the fused baseline existed still renders, without that term.
    older = [{k: v for k, v in r.items() if k != "ratio_to_fused"} for r in rows]
    assert "(1.0x; 1x)" in report.render_markdown([{"rows": older}])


# -- failures and arguments ----------------------------------------------------------------
CORRUPT = """
import sys
from mpidist.comm.communicator import Communicator
original = Communicator.all_reduce

def all_reduce(self, buf, op="sum", timeout=None, send=None):
    out = original(self, buf, op, timeout, send)
    if self.rank == self.size - 1 and buf.size > 3 and op == "max":
        buf[3] += 1  # a wrong value on the last rank only
    return out

Communicator.all_reduce = all_reduce
from mpidist.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("nprocs", [1, 2])
def test_bench_fails_loudly_on_wrong_results(nprocs, tmp_path):
    """A result that differs from the expected values stops the run on every rank (exit 1,
    no hang), naming the rank and the first wrong value; nothing is timed or printed."""
    script = tmp_path / "corrupt.py"
    script.write_text(CORRUPT)
    code, out = run_mpi(nprocs, "bench", "allreduce", "--sizes", "64", "--ops", "sum,max",
                        "--json", program=(str(script),))
    last = nprocs - 1
    assert code == 1, out
    assert '"rows"' not in out, out
    assert (f"mpidist: error on rank {last} of {nprocs} on ") in out, out
    assert ("wrong results on this rank: mpidist Communicator.all_reduce: 1 of 16 values "
            "wrong, first at index 3: got") in out, out
    assert (f"wrong results from all-reduce max of 16 float32 (64B) on rank(s) [{last}]") in out


BAD_ARGUMENTS = [
    ([], "the following arguments are required: {info,bench,run,selftest,backup}"),
    (["bench"], "the following arguments are required: {allreduce,batch,step,keras,ps,input,gpu}"),
    (["bench", "allreduce", "--sizes", "6"], "6 byte(s) is not a whole number of float32 elements"),
    (["bench", "allreduce", "--sizes", "4X"], "'4X' is not a size"),
    (["bench", "allreduce", "--sizes", "64M:4K"], "MAX is smaller than MIN"),
    (["bench", "allreduce", "--ops", "sum,mean"], "ops are a comma-separated list of"),
    (["bench", "allreduce", "--dtype", "float16"], "invalid choice: 'float16'"),
    (["bench", "allreduce", "--iters", "5", "--min-time", "1"], "not allowed with argument"),
    (["bench", "allreduce", "--json", "--csv"], "not allowed with argument"),
    (["bench", "allreduce", "--iters", "0"], "must be a positive integer"),
    (["bench", "batch", "--tensors", "many"], "'many' is not a integer"),
    (["info", "--verbose"], "unrecognized arguments: --verbose"),
]

# Each case run by cli.run in one fresh interpreter, where no earlier test can have started
# MPI (the full suite starts it in-process before this file): the exit status, what went to
# stderr, and whether MPI was initialised once the case had run.
_RUN_BAD_ARGUMENTS = """
import contextlib, io, json, sys
from mpidist import cli
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            cli.run(argv)
            status = 0
        except SystemExit as exc:
            status = exc.code
    mpi = sys.modules.get("mpi4py.MPI")
    results.append({"code": status, "err": err.getvalue(),
                    "mpi": bool(mpi is not None and mpi.Is_initialized())})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def bad_argument_runs():
    proc = subprocess.run([sys.executable, "-c", _RUN_BAD_ARGUMENTS,
                           json.dumps([argv for argv, _ in BAD_ARGUMENTS])],
                          env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)),
                         ids=[message for _, message in BAD_ARGUMENTS])
def test_bad_arguments_exit_2(case, bad_argument_runs):
    """Argument errors end with status 2 and the usage, before MPI starts."""
    result, (_, message) = bad_argument_runs[case], BAD_ARGUMENTS[case]
    assert result["code"] == 2, result
    assert result["err"].startswith("usage: mpidist"), result["err"]
    assert message in result["err"], result["err"]
    assert not result["mpi"], "MPI was initialised by an argument error"


def test_bad_arguments_under_mpiexec_print_once():
    code, out = run_mpi(2, "bench", "allreduce", "--ops", "avg")
    assert code == 2, out
    assert out.count("error: argument --ops") == 1, out


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib (test)')\n")
    env = clean_env(PYTHONPATH=str(tmp_path / "fake"))
    code, out, err = run_alone("bench", "allreduce", "--quick", "--plot", tmp_path / "x.png",
                               env=env)
    assert code == 1, (out, err)
    assert out == ""
    assert err.startswith("mpidist: error on rank 0 (no launcher; before MPI started): --plot "
                          "needs matplotlib"), err
    assert "pip install 'mpidist[plot]'" in err
    assert not (tmp_path / "x.png").exists()


# -- entry points --------------------------------------------------------------------------
def test_console_script_and_module_agree():
    script = Path(sys.executable).parent / "mpidist"
    assert script.exists(), f"console script missing: pip install -e . ({script})"
    code, out, err = run_alone("--version", command=[str(script)])
    assert code == 0, err
    assert out.strip() == f"mpidist {__import__('mpidist').__version__}"
    code, module_out, _ = run_alone("--version")
    assert code == 0 and module_out == out
    code, out, err = run_alone("info", "--json", command=[str(script)])
    assert code == 0, err
    check_info_report(json.loads(out), 1)
    code, out, _ = run_alone("--help")
    assert code == 0 and "{info,bench,run,selftest,backup}" in out
    code, out, _ = run_alone("bench", "allreduce", "--help")
    assert code == 0 and "--sizes SPEC" in out and "--plot OUT.png" in out


def test_backup_says_what_a_backup_directory_holds(tmp_path):
    """``mpidist backup DIR``: one line, exit 0, for the batch scripts' last log line (the
    step itself: tests/unit/test_durable_saves.py)."""
    code, out, _ = run_alone("backup", str(tmp_path / "none"))
    assert code == 0 and out == f"{tmp_path / 'none'} (no backup)\n"
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "checkpoint").write_text("{not json")
    code, out, _ = run_alone("backup", str(tmp_path / "damaged"))
    assert code == 0 and out == f"{tmp_path / 'damaged'} (a backup of unknown step)\n"


def test_bench_ps_quick_json_reports_every_target():
    """``mpidist bench ps`` on chief + ps + 2 workers: every target's metric is measured (the
    numbers themselves depend on the machine; docs/performance.md has them), the job ends."""
    from mpidist.cli.bench_ps import TARGETS

    code, out = launch(4, ["-m", "mpidist", "bench", "ps", "--quick", "--json"], STEP_TIMEOUT)
    assert code == 0, f"exit {code} (None = hang):\n{out}"
    report = json_from(out)["report"]
    assert report["ranks"] == 4 and report["workers"] == 2
    for key, _, _, _ in TARGETS:
        assert report[key] > 0, (key, report)
    assert report["rtt_4k_us"] < report["rtt_4m_us"]
    assert report["idle_ps_cpu"] < 1.0  # a fraction of one core


def test_bench_ps_needs_three_ranks():
    code, out = run_mpi(2, "bench", "ps", "--quick")
    assert code == 1, out
    assert "needs at least 3 ranks (chief, ps, worker)" in out

"""``mpidist bench ps``: ParameterServerStrategy's costs beside raw MPI in the same job
(ps-design.md §8, docs/performance.md "Parameter servers").

Run on at least 3 ranks (chief, ps, worker; 4 gives the two-worker rows)::

    mpiexec -n 4 mpidist bench ps [--json] [--quick]

Rank 0 is the chief and rank 1 the parameter server. Raw ping-pong rounds between them
alternate with rounds of the same traffic through ``PSVariable`` (the server returns from its
loop between rounds, so both run in one job, interleaved); the other ranks wait without
spinning. Then the workers start and the coordinator's costs are measured. Times are medians
of the rounds.
"""

# wait-ok-file: the raw mpi4py calls here are the baselines being measured (and their timers'
# barriers); bounding them would change what is measured. The timed public path is mpidist's.

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["run_ps_benchmark", "ps_table", "TARGETS"]

SMALL, LARGE = 1024, 1024 * 1024          # float32 elements: 4 KiB, 4 MiB
# (metric, target, whether lower is better, what the target is)
TARGETS: list[tuple[str, float, bool, str]] = [
    ("read_4k_x_rtt", 2.0, True, "P1 read 4 KiB <= 2x raw ping-pong"),
    ("read_4m_x_rtt", 0.7, True, "P2 read 4 MiB <= 0.7x raw ping-pong"),
    ("assign_add_4k_x_rtt", 2.5, True, "P3 assign_add (value back) 4 KiB <= 2.5x raw"),
    ("assign_add_4m_x_rtt", 1.0, True, "P3 assign_add (value back) 4 MiB <= 1.0x raw"),
    ("posted_per_s_1w", 50e3, False, "P4 posted 4 KiB updates/s, 1 client >= 50k"),
    ("posted_per_s_2w", 30e3, False, "P5 posted 4 KiB updates/s, 2 workers >= 30k"),
    ("many_reads_x_one", 3.0, True, "P6 read_variables(100 x 4 KB) / one 400 KB read <= 3x"),
    ("schedule_us", 30.0, True, "P7 schedule() <= 30 us"),
    ("closures_per_s", 10e3, False, "P8 empty closures/s, 2 workers >= 10k"),
    ("idle_ps_cpu", 0.05, True, "P9 idle ps CPU share < 5% of a core"),
    ("adam_4m_x_copy", 1.5, True, "P10 fused Adam 4 MiB <= 1.5x copy of 4 arrays"),
]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _idle_barrier(comm: Any, measuring: bool = False) -> None:
    """A barrier that sleeps while it waits (a spinning idle rank steals a core here);
    the two measuring ranks poll it without sleeping, so they leave it together."""
    request = comm.Ibarrier()
    while not request.Test():
        if not measuring:
            time.sleep(0.05)


def _ping_pong(comm: Any, peer: int, rank: int, buf: np.ndarray, calls: int) -> float:
    """Seconds per round trip of ``buf`` between ranks 0 and ``peer`` (raw mpi4py)."""
    start = time.perf_counter()
    for _ in range(calls):
        if rank == 0:
            comm.Send(buf, peer, 7)
            comm.Recv(buf, peer, 7)
        else:
            comm.Recv(buf, 0, 7)
            comm.Send(buf, 0, 7)
    return (time.perf_counter() - start) / calls


def _time(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _adam_vs_copy(rounds: int) -> dict[str, float]:
    """The update math a server runs for apply_adam at 4 MiB, beside copying its 4 arrays."""
    from mpidist.kernels import optimizers as fused  # noqa: PLC0415

    w, g, m, v = (np.random.default_rng(i).random(LARGE, dtype=np.float32) for i in range(4))
    out = np.empty_like(w)
    t = np.float32

    def adam() -> None:
        fused.adam_update(w, g, m, v, None, t(1e-3), t(0.1), t(0.001), t(1e-7))

    def copy4() -> None:
        for a in (w, g, m, v):
            np.copyto(out, a)

    adam()
    adams, copies = [], []
    for _ in range(rounds):
        adams.append(_time(adam, 10))
        copies.append(_time(copy4, 10))
    return {"adam_4m_us": _median_us(adams), "copy4_4m_us": _median_us(copies)}


def _data_plane(runtime: Any, raw: Any, rounds: int, quick: bool) -> dict[str, float]:
    """Rounds of raw ping-pong and of PSVariable traffic between ranks 0 and 1, interleaved."""
    from mpidist.ps.server import ParameterServer  # noqa: PLC0415
    from mpidist.ps.variables import PSVariable, VariableHandle  # noqa: PLC0415
    from mpidist.ps.wire import Op  # noqa: PLC0415

    rank = raw.Get_rank()
    calls = {SMALL: 300 if quick else 2000, LARGE: 10 if quick else 40}
    server = ParameterServer(runtime.transport, runtime.roles) if rank == 1 else None
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    variables: dict[int, PSVariable] = {}
    for round_index in range(rounds):
        for size in (SMALL, LARGE):
            _idle_barrier(raw, rank in (0, 1))
            buf = np.zeros(size, np.float32)
            if rank in (0, 1):
                add(f"rtt_{size}", _ping_pong(raw, 1, rank, buf, calls[size]))
            _idle_barrier(raw, rank in (0, 1))
            if server is not None:
                server.serve()  # until rank 0 sends SHUTDOWN below
            elif rank == 0:
                if size not in variables:
                    handle = VariableHandle(size, 1, 0, f"bench{size}", (size,), "<f4", True, 0, 0)
                    variables[size] = PSVariable.create(runtime.client, handle, buf, None)
                var = variables[size]
                add(f"read_{size}", _time(var.read_value, calls[size]))
                delta = np.ones(size, np.float32)

                def assign_add(v: PSVariable = var, d: np.ndarray = delta) -> Any:
                    return v.assign_add(d)

                add(f"assign_add_{size}", _time(assign_add, calls[size]))
                if size == SMALL:
                    start = time.perf_counter()
                    for _ in range(calls[size]):
                        var.assign_add(delta, read_value=False)
                    runtime.client.fence()
                    add("posted_1w", calls[size] / (time.perf_counter() - start))
                runtime.client.send(1, Op.SHUTDOWN, 0, reply=False)
        del round_index
    _idle_barrier(raw)
    if rank != 0:
        return {}
    med = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "rtt_4k_us": med[f"rtt_{SMALL}"] * 1e6, "rtt_4m_us": med[f"rtt_{LARGE}"] * 1e6,
        "read_4k_us": med[f"read_{SMALL}"] * 1e6, "read_4m_us": med[f"read_{LARGE}"] * 1e6,
        "assign_add_4k_us": med[f"assign_add_{SMALL}"] * 1e6,
        "assign_add_4m_us": med[f"assign_add_{LARGE}"] * 1e6,
        "posted_per_s_1w": med["posted_1w"],
        "read_4k_x_rtt": med[f"read_{SMALL}"] / med[f"rtt_{SMALL}"],
        "read_4m_x_rtt": med[f"read_{LARGE}"] / med[f"rtt_{LARGE}"],
        "assign_add_4k_x_rtt": med[f"assign_add_{SMALL}"] / med[f"rtt_{SMALL}"],
        "assign_add_4m_x_rtt": med[f"assign_add_{LARGE}"] / med[f"rtt_{LARGE}"],
    }


def _coordinator_costs(runtime: Any, rounds: int, quick: bool) -> dict[str, float]:
    """On the chief, with the workers serving: schedule(), closures/s, posted updates/s from
    the workers, many small reads in a closure, and the idle server's CPU share."""
    import mpidist  # noqa: PLC0415
    from mpidist.ps.coordinator import ClusterCoordinator  # noqa: PLC0415
    from mpidist.ps.strategy import ParameterServerStrategy  # noqa: PLC0415
    from mpidist.ps.variables import read_variables  # noqa: PLC0415
    from mpidist.ps.wire import Op  # noqa: PLC0415

    strategy = ParameterServerStrategy.for_task(runtime)
    strategy.extended.start_chief()
    coordinator = ClusterCoordinator(strategy)
    n = 1000 if quick else 5000
    with strategy.scope():
        small = mpidist.Variable(np.zeros(SMALL, np.float32))
        many = [mpidist.Variable(np.zeros(1000, np.float32)) for _ in range(100)]
        one = mpidist.Variable(np.zeros(100 * 1000, np.float32))

    @mpidist.function
    def empty() -> None:
        return None

    @mpidist.function
    def post(k: int) -> None:
        delta = np.ones(SMALL, np.float32)
        for _ in range(k):
            small.assign_add(delta, read_value=False)

    @mpidist.function
    def read_many() -> float:
        read_variables(many[:1])  # the server is awake: the wake-up is not what is timed
        start = time.perf_counter()
        read_variables(many)
        return time.perf_counter() - start

    @mpidist.function
    def read_one() -> float:
        read_variables(many[:1])
        start = time.perf_counter()
        one.read_value()
        return time.perf_counter() - start

    schedule_s, closures, posted, ratio = [], [], [], []
    coordinator.schedule(empty)
    coordinator.join()
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            coordinator.schedule(empty)
        scheduled = time.perf_counter()
        coordinator.join()
        schedule_s.append((scheduled - start) / n)
        closures.append(n / (time.perf_counter() - start))
        k, jobs = 100, max(2, n // 250)
        start = time.perf_counter()
        for _ in range(jobs):
            coordinator.schedule(post, args=(k,))
        coordinator.join()
        posted.append(k * jobs / (time.perf_counter() - start))
        many_s = coordinator.schedule(read_many).fetch()
        one_s = coordinator.schedule(read_one).fetch()
        ratio.append(many_s / one_s)
    client = runtime.client
    ps_rank = runtime.roles.ps_ranks[0]
    time.sleep(1.0)
    before = client.request(ps_rank, Op.STATS, 0, dtype=np.int64)
    time.sleep(1.0)
    after = client.request(ps_rank, Op.STATS, 0, dtype=np.int64)
    idle = (int(after[3]) - int(before[3])) / 1e9
    return {"schedule_us": statistics.median(schedule_s) * 1e6,
            "closures_per_s": statistics.median(closures),
            "posted_per_s_2w": statistics.median(posted),
            "many_reads_x_one": statistics.median(ratio),
            "idle_ps_cpu": idle, "workers": runtime.roles.num_workers}


def run_ps_benchmark(quick: bool = False, rounds: int | None = None) -> dict[str, Any] | None:
    """Run the benchmark on every rank of the job; rank 0 returns the report, others None."""
    from mpidist.cluster_resolver.mpi import MPIClusterResolver  # noqa: PLC0415
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415
    from mpidist.ps.runtime import TaskRuntime  # noqa: PLC0415
    from mpidist.ps.service import serve_task  # noqa: PLC0415

    mpi = mpi_module()
    if mpi.COMM_WORLD.Get_size() < 3:
        raise ValueError("mpidist bench ps needs at least 3 ranks (chief, ps, worker): "
                         "mpiexec -n 4 mpidist bench ps")
    rounds = rounds or (3 if quick else 7)
    runtime = TaskRuntime.connect(MPIClusterResolver(num_ps=1))
    raw = mpi.COMM_WORLD.Dup()
    report = _data_plane(runtime, raw, rounds, quick)
    raw.Free()
    if runtime.task_type != "chief":
        serve_task(runtime)
        return None
    report.update(_coordinator_costs(runtime, rounds, quick))
    report.update(_adam_vs_copy(rounds))
    report["adam_4m_x_copy"] = report["adam_4m_us"] / report["copy4_4m_us"]
    report["ranks"] = runtime.roles.world_size
    return report


def ps_table(report: dict[str, Any]) -> list[str]:
    """The report as text: each target with its measured value and whether it is met."""
    lines = [f"ParameterServerStrategy on {report['ranks']} ranks (chief, 1 ps, "
             f"{report['workers']} workers); raw ping-pong 4 KiB {report['rtt_4k_us']:.1f} us, "
             f"4 MiB {report['rtt_4m_us']:.0f} us",
             f"{'target':<52} {'measured':>12}  met"]
    for key, target, lower, label in TARGETS:
        value = report.get(key)
        if value is None:
            continue
        met = value <= target if lower else value >= target
        lines.append(f"{label:<52} {value:>12.3g}  {'yes' if met else 'NO'}")
    return lines

"""What the single-process core costs: ``strategy.run`` dispatch, ``merge_call`` and
``strategy.reduce``, each measured beside its baseline in the same run and reported as a ratio.

Baselines: calling the step function directly (for run / merge_call), and summing the replicas'
arrays into a new array with NumPy (a copy of the first, then in-place ``np.add`` of the rest,
for reduce). Medians over interleaved
rounds, because these machines are noisy.

    python benchmarks/core_overhead.py [--replicas 1 2 4] [--rounds 7]
"""

import argparse
import queue
import threading

import numpy as np

import mpidist
from job import interleaved  # benchmarks/ is on sys.path: the shared interleaving

SIZES = {"4 KiB": 4 << 10, "256 KiB": 256 << 10, "4 MiB": 4 << 20, "64 MiB": 64 << 20}


class RawReplicaThreads:
    """The floor of TF's model, one persistent Python thread per replica: ``call(fn)`` hands
    ``fn`` to every thread (a SimpleQueue each) and waits (a Condition) until all have run it.
    No contexts, checks or merge_call support: what the thread switches alone cost."""

    def __init__(self, n):
        self.n = n
        self.cond = threading.Condition()
        self.done = 0
        self.queues = [queue.SimpleQueue() for _ in range(n)]
        for q in self.queues:
            threading.Thread(target=self._loop, args=(q,), daemon=True).start()

    def _loop(self, q):
        while True:
            fn = q.get()
            fn()
            with self.cond:
                self.done += 1
                if self.done == self.n:
                    self.cond.notify()

    def call(self, fn):
        with self.cond:
            self.done = 0
            for q in self.queues:
                q.put(fn)
            while self.done < self.n:
                self.cond.wait()


def bench_dispatch(strategy, rounds):
    def step():
        return 1

    def merge_step():
        return mpidist.get_replica_context().merge_call(lambda s: 0)

    n = strategy.num_replicas_in_sync
    direct = lambda: [step() for _ in range(n)]  # noqa: E731 - the baseline: the same calls, inline
    cases = {"direct": direct, "run": lambda: strategy.run(step),
             "run+merge_call": lambda: strategy.run(merge_step)}
    if n > 1:
        threads = RawReplicaThreads(n)
        cases["threads"] = lambda: threads.call(step)
    return interleaved(cases, rounds)


def bench_reduce(strategy, nbytes, rounds):
    n = strategy.num_replicas_in_sync
    count = nbytes // 4
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(count, ctx.replica_id_in_sync_group + 1, dtype=np.float32))
    arrays = list(strategy.experimental_local_results(values))
    expected = np.full(count, n * (n + 1) / 2, dtype=np.float32)
    got = strategy.reduce("SUM", values, axis=None)
    np.testing.assert_array_equal(got, expected)  # validate before timing, as nccl-tests does
    def numpy_sum():
        out = arrays[0].copy()
        for a in arrays[1:]:
            np.add(out, a, out=out)
        return out

    return interleaved({"numpy": numpy_sum,
                        "mpidist": lambda: strategy.reduce("SUM", values, axis=None)}, rounds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args(argv)
    print("## run / merge_call dispatch (µs per step; ratio = time / direct calls; raw threads ="
          " one persistent thread per replica, a queue to start and a condition to collect: the"
          " floor of one-thread-per-replica; own = run - raw threads)")
    print("| replicas | direct | raw threads | run | own | run+merge_call | run ratio "
          "| run+merge ratio |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for n in args.replicas:
        strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        t = bench_dispatch(strategy, args.rounds)
        raw = t.get("threads")
        raw_cell, own_cell = ("-", "-") if raw is None else (f"{raw:.1f}", f"{t['run'] - raw:.1f}")
        print(f"| {n} | {t['direct']:.2f} | {raw_cell} | {t['run']:.1f} | {own_cell} | "
              f"{t['run+merge_call']:.1f} | {t['run'] / t['direct']:.0f}x | "
              f"{t['run+merge_call'] / t['direct']:.0f}x |")
        rows.append(("dispatch", n, t))
    print()
    print("## strategy.reduce(SUM) of float32 PerReplica (µs; ratio = mpidist / NumPy sum)")
    print("| replicas | size | NumPy sum | mpidist reduce | ratio |")
    print("|---|---|---|---|---|")
    for n in args.replicas:
        strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        for label in args.sizes:
            t = bench_reduce(strategy, SIZES[label], args.rounds)
            print(f"| {n} | {label} | {t['numpy']:.1f} | {t['mpidist']:.1f} | "
                  f"{t['mpidist'] / t['numpy']:.2f}x |")
            rows.append(("reduce", n, label, t))
    return rows


if __name__ == "__main__":
    main()

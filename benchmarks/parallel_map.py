"""``Dataset.map(num_parallel_calls=N)`` beside the plain map, in one process: the speedup of a
map function that releases the GIL (NumPy sorting and reductions, as decoding and parsing do)
and of one that holds it (a pure-Python loop: no speedup is expected there).

    python benchmarks/parallel_map.py [--elements 48] [--rounds 7]

Rounds interleave the settings; each row is the median over rounds of one pass over the
dataset, and the ratio is plain / parallel (above 1: parallel is faster).
"""

import argparse
import statistics
import time

import numpy as np

from mpidist.data import AUTOTUNE, Dataset
from mpidist.data.parallel_map import cores_of_this_rank

ARRAY = np.random.default_rng(0).random(300_000)


def releases_gil(i):
    return float(np.sort(ARRAY + float(i)).sum())


def holds_gil(i):
    total = 0
    for k in range(30_000):
        total += (k * int(i)) % 7
    return float(total)


def one_pass(fn, elements, calls):
    start = time.perf_counter()
    out = [float(v) for v in Dataset.range(elements).map(fn, num_parallel_calls=calls)]
    return time.perf_counter() - start, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    cores = cores_of_this_rank()
    settings = [None, 2, AUTOTUNE]
    print(f"# parallel map: {args.elements} elements per pass, {cores} core(s) for this process,"
          f" median of {args.rounds} interleaved rounds")
    print(f"# {'function':<14} {'num_parallel_calls':>18} {'pass ms':>9} {'x plain':>8}")
    for fn in (releases_gil, holds_gil):
        times = {s: [] for s in settings}
        reference = one_pass(fn, args.elements, None)[1]
        for _ in range(args.rounds):
            for s in settings:
                elapsed, out = one_pass(fn, args.elements, s)
                assert out == reference, f"num_parallel_calls={s} changed the results"
                times[s].append(elapsed)
        plain = statistics.median(times[None])
        for s in settings:
            median = statistics.median(times[s])
            name = {None: "None", AUTOTUNE: f"AUTOTUNE ({cores})"}.get(s, str(s))
            print(f"  {fn.__name__:<14} {name:>18} {median * 1e3:9.1f} {plain / median:8.2f}")


if __name__ == "__main__":
    main()

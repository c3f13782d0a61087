"""What the public-boundary input checks cost on the hot path, under OneDeviceStrategy:
``strategy.run`` + ``strategy.reduce`` of a small array, and ``apply_gradients`` of 100
variables inside ``strategy.run``. Prints one JSON line of median µs per call.

To compare two versions of the library, run this script with each on ``PYTHONPATH`` in
alternation (``--compare OLD_DIR``: OLD_DIR holds an ``mpidist`` package), and compare the
medians of the medians; interleaving rounds evens out the machine's noise.

    python benchmarks/validation_overhead.py [--rounds 7]
    python benchmarks/validation_overhead.py --compare /tmp/old --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np
from core_overhead import per_call_us  # benchmarks/ is on sys.path when run as a script


def measure(rounds):
    import mpidist

    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    x = np.arange(256, dtype=np.float32)

    def run_reduce():
        out = strategy.run(lambda a: a * 2, args=(x,))
        return strategy.reduce("SUM", out, axis=None)

    with strategy.scope():
        variables = [mpidist.Variable(np.zeros(64, np.float32), name=f"v{i}") for i in range(100)]
        opt = mpidist.optimizers.SGD(0.01, momentum=0.9)
    grads = [np.full(64, 1e-3, np.float32) for _ in variables]
    pairs = list(zip(grads, variables))

    def apply():
        strategy.run(lambda: opt.apply_gradients(pairs))

    samples = {"run+reduce": [], "apply_gradients_100": []}
    for _ in range(rounds):
        samples["run+reduce"].append(per_call_us(run_reduce))
        samples["apply_gradients_100"].append(per_call_us(apply))
    return {k: statistics.median(v) for k, v in samples.items()}


def compare(old_dir, rounds):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {"old": [], "new": []}
    for _ in range(rounds):
        for label, path in (("old", old_dir), ("new", here)):
            env = dict(os.environ, PYTHONPATH=path)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--rounds", "3"],
                                 env=env, cwd="/", capture_output=True, text=True, check=True)
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for key in results["old"][0]:
        old = statistics.median(r[key] for r in results["old"])
        new = statistics.median(r[key] for r in results["new"])
        print(f"{key:22s} old {old:9.1f} us   new {new:9.1f} us   new/old {new / old:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", metavar="OLD_DIR")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.rounds)
    else:
        print(json.dumps(measure(args.rounds)))


if __name__ == "__main__":
    main()

"""Quick start: linear regression trained with a custom loop under MirroredStrategy.

The same step runs on 1-4 virtual CPU devices (or GPUs) by changing only the strategy. Each
replica computes the loss and hand-written gradients on its share of the global batch; a
merge_call sums the gradients across replicas and applies one SGD step to the mirrored
variables.

    python examples/quickstart.py --replicas 4
    mpiexec -n 2 python examples/quickstart.py --multi-worker --replicas 2   # 2 ranks x 2 replicas

With ``--multi-worker`` the same code runs under MultiWorkerMirroredStrategy: every MPI rank
is a worker with ``--replicas`` CPU replicas, and only the chief prints.
"""

import argparse
import json

import numpy as np

import mpidist

TRUE_W = np.array([2.0, -3.0, 0.5])
TRUE_B = 1.0


def make_data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = x @ TRUE_W + TRUE_B + 0.01 * rng.normal(size=n)
    return x, y


def train(strategy, steps=100, global_batch=64, learning_rate=0.1):
    """Train and return (w, b, final loss) as host arrays."""
    with strategy.scope():
        w = mpidist.Variable(np.zeros(3), name="w")
        b = mpidist.Variable(0.0, name="b")
    x_all, y_all = make_data()

    def apply_gradients(strat, grad_w, grad_b):
        # Sum the per-replica gradients onto the variables' devices, then update every copy.
        for var, grad in ((w, grad_w), (b, grad_b)):
            total = strat.extended.reduce_to(mpidist.ReduceOp.SUM, grad, var)
            strat.extended.update(var, lambda v, g: v.assign_sub(learning_rate * g), args=(total,))

    def train_step(x, y):
        err = x @ w + b - y                       # w and b read as this replica's copy
        loss = np.sum(err**2) / global_batch      # scaled by the GLOBAL batch size
        grad_w = 2.0 * x.T @ err / global_batch
        grad_b = np.array(2.0 * np.sum(err) / global_batch)
        mpidist.get_replica_context().merge_call(apply_gradients, args=(grad_w, grad_b))
        return loss

    # The global batch of each step is split across the replicas (and the workers) by the
    # strategy: replica i of N gets its consecutive share of the 64 rows.
    dataset = mpidist.data.Dataset.from_tensor_slices((x_all, y_all)).repeat().batch(global_batch)
    batches = strategy.experimental_distribute_dataset(dataset)
    loss = None
    for _, (xs, ys) in zip(range(steps), batches):
        per_replica_loss = strategy.run(train_step, args=(xs, ys))
        loss = strategy.reduce(mpidist.ReduceOp.SUM, per_replica_loss, axis=None)
    return w.numpy(), b.numpy(), float(loss)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2, help="virtual CPU devices to mirror over")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--multi-worker", action="store_true",
                        help="MultiWorkerMirroredStrategy: run under mpiexec/srun, one worker per rank")
    parser.add_argument("--json", action="store_true", help="print the exact weights as JSON")
    args = parser.parse_args(argv)
    devices = [f"/cpu:{i}" for i in range(args.replicas)]
    if args.multi_worker:
        resolver = mpidist.cluster_resolver.MPIClusterResolver(local_devices=devices)
        strategy = mpidist.MultiWorkerMirroredStrategy(resolver)
    else:
        strategy = mpidist.MirroredStrategy(devices)
    w, b, loss = train(strategy, steps=args.steps)
    if strategy.extended.should_checkpoint:  # the chief reports
        if args.json:
            print(json.dumps({"replicas": strategy.num_replicas_in_sync, "w": w.tolist(),
                              "b": float(b), "loss": loss}))
        else:
            print(f"replicas={strategy.num_replicas_in_sync} w={np.round(w, 3).tolist()} "
                  f"b={round(float(b), 3)} loss={loss:.5f}")
    return w, b, loss


if __name__ == "__main__":
    main()

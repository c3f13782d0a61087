"""An Equinox MLP trained with an optax optimizer under any strategy: JAX pytrees through
mpidist's collectives (docs/keras.md, "JAX models").

Each replica differentiates its share of the global batch with Equinox; the gradient leaves
cross the replicas in one fused all-reduce (``ReplicaContext.all_reduce("MEAN", leaves)``);
optax updates the model once per worker. The data are scikit-learn's 8x8 digits.

    python examples/equinox_optax.py                           # one device
    python examples/equinox_optax.py --replicas 2              # MirroredStrategy, 2 CPU devices
    mpiexec -n 2 python examples/equinox_optax.py --multi-worker

Every layout ends with the same weights (float32 rounding); ``--json`` prints them on the
chief. Needs ``pip install 'mpidist[jax-libs,examples]'``.
"""

import argparse
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import mpidist
from mpidist.data import Dataset

GLOBAL_BATCH = 64


def digits(seed=0):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order][:1500], y[order][:1500], x[order][1500:], y[order][1500:]


def loss_fn(model, x, y):
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@eqx.filter_jit
def gradients(model, x, y):
    return eqx.filter_value_and_grad(loss_fn)(model, x, y)


def make_strategy(args):
    if args.multi_worker:
        return mpidist.MultiWorkerMirroredStrategy()
    if args.replicas > 1:
        return mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    return mpidist.OneDeviceStrategy("/cpu:0")


def train(strategy, epochs=5, learning_rate=0.05):
    # The same key on every rank: the same initial weights everywhere.
    model = eqx.nn.MLP(64, 10, width_size=64, depth=1, key=jax.random.PRNGKey(0))
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def update(model, grads, opt_state):
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state

    def replica_step(model, x, y):  # once per replica, on its share of the global batch
        loss, grads = gradients(model, x, y)
        leaves, tree = jax.tree.flatten(grads)
        leaves = mpidist.get_replica_context().all_reduce("MEAN", leaves)  # one all-reduce
        return loss, jax.tree.unflatten(tree, [jnp.asarray(g) for g in leaves])

    x_train, y_train, x_test, y_test = digits()
    dataset = Dataset.from_tensor_slices((x_train, y_train)).batch(GLOBAL_BATCH,
                                                                   drop_remainder=True)
    batches = strategy.experimental_distribute_dataset(dataset)
    for _ in range(epochs):
        for x, y in batches:
            _, grads = strategy.run(replica_step, args=(model, x, y))
            grads = strategy.experimental_local_results(grads)[0]  # every replica: the mean
            model, opt_state = update(model, grads, opt_state)
    accuracy = float((jax.vmap(model)(x_test).argmax(axis=1) == y_test).mean())
    return model, accuracy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--multi-worker", action="store_true")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    strategy = make_strategy(args)
    model, accuracy = train(strategy, epochs=args.epochs)
    if strategy.extended.should_checkpoint:
        weights = [np.asarray(leaf).tolist() for leaf in
                   jax.tree.leaves(eqx.filter(model, eqx.is_array))] if args.json else None
        print(json.dumps({"replicas": strategy.num_replicas_in_sync, "accuracy": accuracy,
                          "weights": weights}), flush=True)
    return model, accuracy


if __name__ == "__main__":
    main()

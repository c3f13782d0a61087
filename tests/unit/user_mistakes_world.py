"""A small training world per strategy for the user-mistake corpus: two variables, an SGD
optimizer with momentum slots after one step, a Mean metric with state, and a snapshot of
everything a mistake must leave unchanged."""

import numpy as np

import mpidist
from mpidist import metrics, optimizers

STRATEGIES = {
    "default": lambda: mpidist.get_strategy(),
    "one_device": lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    "mirrored2": lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    "mirrored4": lambda: mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(4)]),
}
ALL = tuple(STRATEGIES)
DISTRIBUTED = ("mirrored2", "mirrored4")
STRATEGIES_ONLY = ("one_device", "mirrored2", "mirrored4")


class World:
    def __init__(self, kind):
        self.kind = kind
        self.s = STRATEGIES[kind]()
        self.n = self.s.num_replicas_in_sync
        with self.s.scope():
            self.v = mpidist.Variable(np.array([1.0, 2.0, 3.0]), name="v")
            self.w = mpidist.Variable(np.ones((2, 2)), name="w")
            self.opt = optimizers.SGD(0.1, momentum=0.9)
            self.metric = metrics.Mean()
        self.g = np.full(3, 0.5)
        self.step([(self.g, self.v), (np.ones((2, 2)), self.w)])
        self.in_replicas(lambda: self.metric.update_state(np.array([1.0, 3.0])))
        self.bools = self.s.run(lambda: np.array([True, False]))
        self.floats = self.s.run(lambda: np.array([1.0, 2.0]))

    def in_replicas(self, fn):
        return self.s.run(fn)

    def step(self, pairs, **kwargs):
        return self.s.run(lambda: self.opt.apply_gradients(pairs, **kwargs))

    def snapshot(self):
        local = self.s.experimental_local_results
        out = {}
        for var in (self.v, self.w):
            out[var.name] = [np.array(c) for c in local(var)]
            out[var.name + "/momentum"] = [np.array(c) for c in local(self.opt.get_slot(var, "momentum"))]
        out["iterations"] = [np.array(c) for c in local(self.opt.iterations)]
        out["metric"] = [np.array(c) for var in self.metric.variables for c in local(var)]
        return out


def assert_same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        assert len(before[key]) == len(after[key]), key
        for b, a in zip(before[key], after[key]):
            np.testing.assert_array_equal(a, b, err_msg=key)

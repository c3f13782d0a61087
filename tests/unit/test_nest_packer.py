"""``nest.packer(structure)`` packs exactly as ``pack_sequence_as(structure, ...)`` does, for
every structure (generated): it only prepares the packing once for a stream of batches."""

import collections

from hypothesis import given
from hypothesis import strategies as st

from mpidist.core import nest

Point = collections.namedtuple("Point", "x y")

leaves = st.integers(0, 9)
keys = st.sampled_from(["b", "a", "c", "x10", "x2"])
structures = st.recursive(
    leaves,
    lambda inner: st.one_of(st.tuples(inner), st.tuples(inner, inner), st.lists(inner, max_size=3),
                            st.dictionaries(keys, inner, max_size=4),
                            st.builds(Point, inner, inner)),
    max_leaves=8)


@given(structures)
def test_packer_is_pack_sequence_as(structure):
    flat = nest.flatten(structure)
    values = [f"v{i}" for i in range(len(flat))]
    want = nest.pack_sequence_as(structure, values)
    got = nest.packer(structure)(values)
    assert got == want and type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)  # the template's key order

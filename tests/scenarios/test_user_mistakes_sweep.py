"""The sweep over the corpus of user mistakes (tests/unit/test_user_mistakes.py): every case
on every strategy it applies to, in one test, raises an error of its documented type and never
one of Python's internal-looking errors. It repeats the corpus's 578 runs (about 5 s), so it is
a scenario; ``test_mistake`` checks each run on its own in the fast subset."""

from test_user_mistakes import CASES  # the corpus (tests/unit)
from user_mistakes_world import World


def test_sweep_no_internal_errors():
    """Every case on every strategy it applies to raises an error of its documented type, and
    never one of Python's internal-looking errors (AttributeError, bare KeyError/IndexError,
    'too many values to unpack')."""
    escaped = []
    for case in CASES:
        for kind in case.kinds:
            world = World(kind)
            try:
                case.action(world)
            except Exception as exc:  # noqa: BLE001 - the sweep classifies every escape
                internal = type(exc) in (AttributeError, KeyError, IndexError) or \
                    "unpack" in str(exc) or not isinstance(exc, case.error)
                if internal:
                    escaped.append(f"{case.id}[{kind}]: {type(exc).__name__}: {exc}")
            else:
                escaped.append(f"{case.id}[{kind}]: no error")
    assert escaped == []

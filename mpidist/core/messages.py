"""How error messages show a user's value: on one line, and short."""

__all__ = ["short_repr", "named_instance"]


def short_repr(x: object, limit: int = 60) -> str:
    """``repr(x)`` on one line (so messages stay greppable), cut to ``limit`` characters."""
    text = " ".join(repr(x).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def named_instance(x: object) -> str:
    """``MirroredStrategy at 0x7f...``: which object of a class, for messages that compare two
    of them (two strategies, say)."""
    return f"{type(x).__name__} at {id(x):#x}"

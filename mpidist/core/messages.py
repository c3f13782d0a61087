"""How error messages show a user's value: on one line, and short."""

__all__ = ["short_repr"]


def short_repr(x: object, limit: int = 60) -> str:
    """``repr(x)`` on one line (so messages stay greppable), cut to ``limit`` characters."""
    text = " ".join(repr(x).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."

"""``SkipStep``: a selftest step cannot run here. Apart from the steps so that the adapters
they call (``selftest_kernels``) raise it without importing the steps back."""

__all__ = ["SkipStep"]


class SkipStep(Exception):
    """The step cannot run here (a missing library): the message says what and the fix."""

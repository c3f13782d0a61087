"""The ``mpidist`` command (console script and ``python -m mpidist``)."""


def main(argv=None):
    raise SystemExit("mpidist: the command line is being built; see docs/launching.md")

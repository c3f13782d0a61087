"""``python -m mpidist.guard [--] PROGRAM [ARGS...]``: run PROGRAM as this rank, and report
on stderr if it dies (see mpidist.launch.guard)."""

import sys

from mpidist.launch.guard import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m mpidist``: the mpidist command."""

from mpidist.cli import main

if __name__ == "__main__":
    main()

"""slurm/train.py with a learning rate that depends on the array task, as an array job's
program varies by ``SLURM_ARRAY_TASK_ID``: ``--rates R0,R1,...`` gives task k the rate Rk (the
other arguments are train.py's). Two tasks that resumed each other's backups would end with
each other's models."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "slurm"))

import train  # slurm/train.py


def main():
    argv = sys.argv[1:]
    at = argv.index("--rates")
    rates = argv[at + 1].split(",")
    del argv[at:at + 2]
    train.main([*argv, "--learning-rate", rates[int(os.environ["SLURM_ARRAY_TASK_ID"])]])


if __name__ == "__main__":
    main()

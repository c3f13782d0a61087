#!/usr/bin/env bash
# Fills wheels/ (or the folder given) with the small wheels tests/gpu/first_contact.sh installs
# on a GPU node that has no network: the mpich wheel (libmpi and mpiexec), autograd and
# pytest-mpi, for CPython 3.12 on x86-64 Linux (the GPU machine's Python). Run where pip can
# download; wheels/ is ignored by git (the mpich wheel is large) and travels as a carried path.
#
#   tests/gpu/fetch_wheels.sh [DIR]          # default: wheels/ at the repository root
set -eu -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-$ROOT/wheels}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR"
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DIR" \
    "mpich>=4.2" "autograd>=1.7" "pytest-mpi>=0.6"
ls -l "$DIR"

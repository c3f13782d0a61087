#!/usr/bin/env bash
# The first-contact command: every GPU path of mpidist once on one GPU, from this checkout,
# with the node's preinstalled packages (CuPy, numba-cuda, NCCL, JAX, mpi4py) plus the small
# wheels that travel with the tree in wheels/ (the mpich wheel, autograd, pytest-mpi;
# tests/gpu/fetch_wheels.sh fills it where pip can download). No network is needed.
#
#   tests/gpu/first_contact.sh [--report PATH] [other `mpidist selftest --gpu` options]
#
# 1. installs every wheel of wheels/ (or $MPIDIST_WHEELS) with pip --no-index --no-deps into a
#    prefix of its own under a temporary folder (never into the node's Python), and puts its
#    site-packages, bin/ (mpiexec) and lib/ (libmpi) first on PYTHONPATH, PATH and
#    LD_LIBRARY_PATH;
# 2. makes this checkout importable without installing it: a folder of links to mpidist/*,
#    with kernels/ linked in as mpidist/kernels (what installing does);
# 3. runs `python -m mpidist selftest --gpu "$@"` and exits with its status: 0 every step
#    passed, 1 a step failed, 3 no GPU (dry run), 2 bad arguments (docs/testing.md).
# With FIRST_CONTACT_PYTEST=1 it then also runs the GPU tests:
#    MPIDIST_TEST_GPU=1 python -m pytest -m gpu tests/gpu tests/unit (status 1 if they fail).
# PYTHON picks the interpreter (default python3). The temporary folder is removed at exit.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${MPIDIST_WHEELS:-$ROOT/wheels}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mpidist-first-contact.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if ((${#wheels[@]})); then
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --ignore-installed \
            --disable-pip-version-check --prefix "$WORK/prefix" "${wheels[@]}"; then
        echo "first_contact: pip could not install the wheels of $WHEELS" >&2
        exit 1
    fi
    site="$("$PYTHON" -c 'import sys, sysconfig
print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' \
        "$WORK/prefix")"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$WORK/prefix/bin:$PATH"
    export LD_LIBRARY_PATH="$WORK/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [ -e "$WORK/prefix/lib/libmpi.so.12" ]; then
        export MPI4PY_LIBMPI="$WORK/prefix/lib"  # mpi4py loads the wheel's MPI from there
    fi
    echo "first_contact: installed ${#wheels[@]} wheel(s) from $WHEELS:" \
        "$(for w in "${wheels[@]}"; do basename "$w" | cut -d- -f1-2; done | tr '\n' ' ')" >&2
else
    echo "first_contact: no wheels in $WHEELS (tests/gpu/fetch_wheels.sh fills it);" \
        "using what is installed" >&2
fi

mkdir -p "$WORK/src/mpidist"
for entry in "$ROOT"/mpidist/*; do
    ln -s "$entry" "$WORK/src/mpidist/"
done
ln -s "$ROOT/kernels" "$WORK/src/mpidist/kernels"
export PYTHONPATH="$WORK/src${PYTHONPATH:+:$PYTHONPATH}"

"$PYTHON" -m mpidist selftest --gpu "$@"
status=$?
if [ "${FIRST_CONTACT_PYTEST:-0}" = "1" ] && [ "$status" != "2" ]; then
    (cd "$ROOT" && MPIDIST_TEST_GPU=1 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu tests/unit) || status=1
fi
exit "$status"

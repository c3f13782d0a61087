"""A source checkout's ``mpidist/`` imported instead of the installed package (a job started in
the checkout's directory): the import fails at once, saying which interpreter found which
mpidist and how to fix it, not later with ``No module named 'mpidist.kernels'``."""

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mpidist"


def test_a_checkout_without_its_kernels_says_what_was_found_and_the_fix(tmp_path):
    (tmp_path / "mpidist").symlink_to(PACKAGE, target_is_directory=True)  # no kernels/ inside
    # -S: no site-packages, so no installed (or editable) mpidist can supply mpidist.kernels
    proc = subprocess.run([sys.executable, "-S", "-c",
                           f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import mpidist"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: "), proc.stderr
    assert f"{sys.executable} imported mpidist from {tmp_path / 'mpidist'}" in message
    assert "a source checkout" in message and "pip install -e" in message
    assert "No module named" not in proc.stderr

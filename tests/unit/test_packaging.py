"""Every package of the source tree is installed: pyproject.toml lists its packages one by one,
and a package missing from that list works from a checkout (editable install, PYTHONPATH) but
not from a regular install, where ``import mpidist`` then fails."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_of_the_tree_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for init in (ROOT / "mpidist").rglob("__init__.py")}
    assert found - listed == set(), (
        f"add these packages to [tool.setuptools] packages in pyproject.toml: "
        f"{sorted(found - listed)}")
    assert "mpidist.kernels" in listed  # mapped from the top-level kernels/ (package-dir)

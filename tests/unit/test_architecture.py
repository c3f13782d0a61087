"""The layering of DESIGN.md section 3, enforced: a module may import only from its own layer
or lower ones. Also: ``import mpidist`` initialises nothing heavy."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. Each entry: (layer name, module prefixes).
LAYERS = [
    ("base", ["mpidist.errors", "mpidist.config", "mpidist.types", "mpidist.logs"]),
    ("core", ["mpidist.core"]),
    ("kernels", ["mpidist.kernels"]),
    ("backend", ["mpidist.backend"]),
    ("comm", ["mpidist.comm"]),
    ("cluster", ["mpidist.cluster_resolver"]),
    ("values", ["mpidist.values"]),
    ("ops", ["mpidist.ops"]),
    ("data", ["mpidist.data"]),
    ("strategies", ["mpidist.strategies"]),
    ("training", ["mpidist.training"]),
    ("api", ["mpidist.__init__", "mpidist.__main__", "mpidist.cli", "mpidist.cli_info",
             "mpidist.cli_bench", "mpidist.cli_bench_step", "mpidist.cli_bench_step_report",
             "mpidist.cli_plot", "mpidist.experimental",
             "mpidist.nn", "mpidist.optimizers", "mpidist.metrics", "mpidist.train",
             "mpidist.callbacks", "mpidist.launch", "mpidist.guard"]),
]


def layer_of(module):
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = rank
    if module == "mpidist":
        return len(LAYERS) - 1
    return best


def source_modules():
    """(module name, path) for every module of the package, kernels/ included."""
    found = []
    for path in sorted((ROOT / "mpidist").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1 and parts != ["mpidist", "__init__"]:
            parts = parts[:-1]
        found.append((".".join(parts), path))
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        rel = path.relative_to(ROOT / "kernels").with_suffix("")
        parts = ["mpidist", "kernels", *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def imported_modules(module, path):
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield target, node.lineno


MODULES = source_modules()


def test_every_module_has_a_layer():
    unplaced = [m for m, _ in MODULES if layer_of(m) is None]
    assert not unplaced, f"add these modules to LAYERS in {__file__}: {unplaced}"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_go_down_only(module, path):
    own = layer_of(module)
    bad = []
    for target, line in imported_modules(module, path):
        if target and (target == "mpidist" or target.startswith("mpidist.")):
            their = layer_of(target)
            if their is not None and their > own:
                bad.append(f"{path.name}:{line} imports {target} ({LAYERS[their][0]} layer)")
    assert not bad, f"{module} ({LAYERS[own][0]} layer) imports a higher layer: {bad}"


def test_layer_check_catches_an_upward_import(tmp_path):
    """The checker itself must see an upward import (guards against a vacuous test)."""
    fake = tmp_path / "distributed_variables.py"
    fake.write_text("from mpidist.strategies.mirrored import MirroredStrategy\n")
    targets = [t for t, _ in imported_modules("mpidist.values.distributed_variables", fake)]
    assert layer_of(targets[0]) > layer_of("mpidist.values.distributed_variables")


def test_import_mpidist_is_side_effect_free():
    code = (
        "import sys; import mpidist, mpidist.kernels; "
        "heavy = [m for m in ('mpi4py.MPI', 'cupy', 'numba', 'numba.cuda') if m in sys.modules]; "
        "print(','.join(heavy) or 'none')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none", f"import mpidist loaded: {out.stdout.strip()}"

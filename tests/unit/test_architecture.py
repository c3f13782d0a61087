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
    ("base", ["mpidist.errors", "mpidist.config", "mpidist.types", "mpidist.logs",
              "mpidist.launcher_env", "mpidist._shadowed"]),
    ("core", ["mpidist.core"]),
    ("kernels", ["mpidist.kernels"]),
    ("backend", ["mpidist.backend"]),
    ("comm", ["mpidist.comm"]),
    ("cluster", ["mpidist.cluster_resolver"]),
    ("values", ["mpidist.values"]),
    ("ops", ["mpidist.ops"]),
    ("data", ["mpidist.data"]),
    ("strategies", ["mpidist.strategies"]),
    ("ps", ["mpidist.ps"]),
    ("training", ["mpidist.training"]),
    ("api", ["mpidist.__init__", "mpidist.__main__", "mpidist.cli", "mpidist.experimental",
             "mpidist.nn", "mpidist.autodiff", "mpidist.optimizers", "mpidist.metrics", "mpidist.train",
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


# -- Public contracts between modules (issue 17) ------------------------------------------------
# A module may use another object's ``_private`` name only where the module itself defines that
# name (a class with its hooks, a subclass through ``self``). Everything else crosses a module
# boundary through public names: an attribute ``other._x``, ``getattr / hasattr / setattr``
# with a private string, or ``from module import _x`` is a violation.

# Python's own protocols whose names start with an underscore (namedtuple, sys, os).
STDLIB_PRIVATE_PROTOCOLS = frozenset({"_make", "_fields", "_asdict", "_replace", "_getframe",
                                      "_exit"})



def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _names_defined_in(tree):
    """Every name the module defines: functions, classes, assigned names and attributes,
    arguments, imports and ``__slots__`` entries."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(e.value for e in getattr(node.value, "elts", ())
                         if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def _on_self(node):
    """Whether an attribute is read through ``self``, ``cls`` or ``super()``."""
    owner = node.value
    if isinstance(owner, ast.Name):
        return owner.id in ("self", "cls")
    return isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) \
        and owner.func.id == "super"


def private_accesses(source, filename="<source>"):
    """``(line, name)`` for each use of another module's private name in ``source``."""
    tree = ast.parse(source, filename=filename)
    defined = _names_defined_in(tree)

    def foreign(name):
        return _is_private(name) and name not in defined and name not in STDLIB_PRIVATE_PROTOCOLS

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if foreign(node.attr) and not _on_self(node):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, a.name) for a in node.names
                         if _is_private(a.name) and a.name not in STDLIB_PRIVATE_PROTOCOLS)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) \
                    and foreign(name.value):
                found.append((node.lineno, name.value))
    return sorted(found)


def test_modules_use_only_public_names_of_other_modules():
    bad = []
    for _, path in MODULES:
        rel = path.relative_to(ROOT).as_posix()
        bad.extend(f"{rel}:{line} {name}"
                   for line, name in private_accesses(path.read_text(), str(path)))
    assert not bad, (
        "these modules reach into other modules' private names; use (or add) a public, "
        "documented name instead (see docs/concepts.md, 'Contracts between layers'):\n  "
        + "\n  ".join(bad))


def test_private_access_check_sees_each_kind_of_violation():
    """The checker itself must see every kind (guards against a vacuous test)."""
    source = (
        "from mpidist.values.variables import _initial_array\n"
        "def f(var, strategy):\n"
        "    var._value\n"
        "    getattr(strategy, '_is_default', False)\n"
        "    self._own, super()._base, point._replace, cls._x\n"
        "class Own:\n"
        "    def _hook(self): other._hook()\n"
    )
    assert private_accesses(source) == [(1, "_initial_array"), (3, "_value"), (4, "_is_default")]


def test_strategies_implement_what_the_values_layer_asks_of_them():
    """The Protocols of mpidist.values.protocols, met by every strategy and replica context."""
    import mpidist
    from mpidist.strategies.replica_context import ReplicaContext
    from mpidist.values.protocols import (
        ExtendedProtocol,
        ReplicaContextProtocol,
        StrategyProtocol,
    )

    strategies = [mpidist.get_strategy(), mpidist.OneDeviceStrategy("/cpu:0"),
                  mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])]
    for strategy in strategies:
        assert isinstance(strategy, StrategyProtocol), strategy
        assert isinstance(strategy.extended, ExtendedProtocol), strategy.extended
        assert isinstance(ReplicaContext(strategy, 0), ReplicaContextProtocol)

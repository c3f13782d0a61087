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
    ("io", ["mpidist.io"]),
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
    ("keras", ["mpidist.keras"]),
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


# Keras has no public name for these parts of its JAX trainer; the one file that names Keras's
# internals (so that a Keras upgrade that moves one fails there) may use them, and only them.
THIRD_PARTY_INTERNALS = {"mpidist/keras/keras_api.py": {"_update_metrics_variables",
                                                         "_call_has_training_arg"}}


def test_modules_use_only_public_names_of_other_modules():
    bad = []
    for _, path in MODULES:
        rel = path.relative_to(ROOT).as_posix()
        allowed = THIRD_PARTY_INTERNALS.get(rel, set())
        bad.extend(f"{rel}:{line} {name}"
                   for line, name in private_accesses(path.read_text(), str(path))
                   if name not in allowed)
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


# -- No import cycles (issue 24) ----------------------------------------------------------------
# A cycle is a strongly connected component of two or more modules in the graph of every import
# statement that can run: at module top and inside functions alike (a function-level import only
# postpones the cycle to the first call). What is, and is not, an edge:
# - ``import a.b`` and ``from a.b import name`` are edges to ``a.b``; ``from a import sub`` where
#   ``sub`` is a submodule is an edge to ``a.sub``;
# - importing ``a.b`` initialises ``a`` first, so it is an edge to ``a`` too, except where ``a``
#   is an ancestor package of the importer: Python initialised it before the importer's body ran,
#   so that implicit initialisation never waits on the importer. Reading a name from one's own
#   package (``from a import name`` in ``a.b``, ``name`` not a submodule) is an edge all the same:
#   ``a/__init__`` is usually what imported ``a.b`` and may not have bound ``name`` yet;
# - imports under ``if TYPE_CHECKING:`` are not edges: they never run, and mypy resolves cycles
#   among annotations;
# - ``importlib.import_module("a.b")`` with a literal name is an edge like ``import a.b``.

# Cycles allowed: none (an entry would be an exact set of module names, so a new cycle, or an
# allowed one grown or shrunk, still fails).
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _type_checking_nodes(tree):
    """ids of every node inside the body of an ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                   "typing.TYPE_CHECKING"):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _ancestors(module):
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_literal_import_module(node):
    """``importlib.import_module("a.b")`` (or ``import_module("a.b")``) with a literal name."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return False
    return ast.unparse(node.func) in ("importlib.import_module", "import_module")


def import_edges(module, path, known):
    """``(target, line)`` for each module of ``known`` that ``module`` (at ``path``) imports
    when its statements run: the edges defined above."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    skipped = _type_checking_nodes(tree)
    own_ancestors = set(_ancestors(module))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
            reads_names = len(submodules) < len(node.names)
            named = submodules + ([source] if reads_names else [])
        elif _is_literal_import_module(node):
            named = [node.args[0].value]
        else:
            continue
        for target in named:
            while target and target not in known:  # an attribute or a module outside the package
                target = target.rpartition(".")[0]
            if not target:
                continue
            if target != module:
                yield target, node.lineno
            for parent in _ancestors(target):
                if parent in known and parent != module and parent not in own_ancestors:
                    yield parent, node.lineno


def import_graph(modules):
    """``{module: {target: [lines]}}`` over ``modules`` (``(module, path)`` pairs)."""
    known = {m for m, _ in modules}
    graph = {}
    for module, path in modules:
        edges = graph.setdefault(module, {})
        for target, line in import_edges(module, path, known):
            edges.setdefault(target, set()).add(line)
    return {m: {t: sorted(lines) for t, lines in edges.items()} for m, edges in graph.items()}


def import_cycles(graph):
    """The strongly connected components of two or more modules (Tarjan's, iteratively)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe_cycle(component, graph, where):
    """The shortest chain round ``component`` from its first module, as ``file:line ->`` links
    (each file imports the next at that line), then every other import inside it: the places
    to cut. ``where`` maps a module to its file's name as printed."""
    start = min(component)
    previous = {start: None}
    queue = [start]
    while queue and start not in [t for t in graph[queue[0]] if t in component]:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target in component and target not in previous:
                previous[target] = node
                queue.append(target)
    last = queue[0] if queue else start
    chain = [last]
    while previous[chain[-1]] is not None:
        chain.append(previous[chain[-1]])
    chain.reverse()
    links = [f"{where(m)}:{','.join(map(str, graph[m][n]))}"
             for m, n in zip(chain, chain[1:] + [start])]
    used = set(zip(chain, chain[1:] + [start]))
    others = [f"{where(m)}:{','.join(map(str, lines))} -> {n}"
              for m in sorted(component) for n, lines in sorted(graph[m].items())
              if n in component and (m, n) not in used]
    text = f"{len(component)} modules: " + " -> ".join(links) + f" -> {start}"
    return text + "".join(f"\n      also {edge}" for edge in others)


def test_no_import_cycles():
    graph = import_graph(MODULES)
    paths = {m: p.relative_to(ROOT).as_posix() for m, p in MODULES}
    cycles = import_cycles(graph)
    unexpected = [c for c in cycles if c not in ALLOWED_CYCLES]
    gone = [c for c in ALLOWED_CYCLES if c not in cycles]
    assert not unexpected, (
        "import cycles (each file imports the next at the line given; a function-level import "
        "counts): move the shared piece below both, pass a callable in, or split the module:\n  "
        + "\n  ".join(describe_cycle(c, graph, paths.get) for c in sorted(unexpected, key=min)))
    assert not gone, (f"these allowed cycles no longer exist; delete them from ALLOWED_CYCLES in "
                      f"{__file__}: {[sorted(c) for c in gone]}")


def test_cycle_check_sees_each_kind_of_edge(tmp_path):
    """The checker itself (guards against a vacuous test): a cycle closed by a function-level
    import, one closed by reading a name from the own package, one through
    ``importlib.import_module``, none through ``TYPE_CHECKING`` or through the implicit
    initialisation of the own package."""
    files = {
        "__init__.py": "from pkg.a import A\nfrom pkg import d\n",
        "a.py": ("from typing import TYPE_CHECKING\nfrom pkg import b\n"
                 "if TYPE_CHECKING:\n    from pkg.c import C\nclass A: pass\n"),
        "b.py": "def f():\n    from pkg.a import A\n    return A\n",
        "c.py": "from pkg.a import A\nclass C(A): pass\n",
        "d.py": "from pkg import A\n",
        "e.py": "import importlib\nimportlib.import_module('pkg.f')\n",
        "f.py": "def g():\n    import pkg.e\n",
    }
    (tmp_path / "pkg").mkdir()
    modules = []
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
        module = "pkg" if name == "__init__.py" else "pkg." + name[:-3]
        modules.append((module, tmp_path / "pkg" / name))
    graph = import_graph(modules)
    assert sorted(sorted(c) for c in import_cycles(graph)) == [["pkg", "pkg.d"],
                                                                ["pkg.a", "pkg.b"],
                                                                ["pkg.e", "pkg.f"]]
    text = describe_cycle(frozenset({"pkg.a", "pkg.b"}), graph, lambda m: m)
    assert text == "2 modules: pkg.a:2 -> pkg.b:2 -> pkg.a"

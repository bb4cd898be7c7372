"""The engine's shape: a core and its layers (docs/concepts/trainer.md).

The core is trainer/'s top-level modules; compat/, extras/ and cli/ are layers above it, support/ a leaf below it.
The core never imports a layer, a layer takes only the core's public names, nothing imports a trainer module inside
a function (the way to dodge a circle), there is no import circle, and the core stays small enough to read. The leaf
imports nothing else of trainer/, only the core imports it, it knows no flag and its public list is closed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "trainer"
LAYERS = ("compat", "extras", "cli")
LEAF = "support"  # below the core: what knows nothing of training
LEAF_MAX_LINES = 1200
FUNCTION_MAX_LINES = 80  # a function (or method) read in one screen
# the Trainer class and the share of trainer/'s lines over 100 characters (the anchors' line length) may not grow;
# the goals are 600 lines and 5 % (issue 40): today's figures, lowered as the loop's parts move out and lines wrap
TRAINER_MAX_LINES = 938  # 920 + issue 41's validation cadence and wall-time split and issue 42's sharding (+1)
LONG_LINE_MAX_SHARE = 0.162
# entry points that only re-export: the package itself, `python -m`, and the seed guides' `trainer.base`
DOORS = ("", "__main__", "base")
# the core may not grow past today's size; the goal is 4,000 lines (moving what every run does not need into layers).
# 5,200 -> 5,257 for fixes: a plain task's test split is scored, the default loss refuses what it cannot score, a
# refused resume tells a Python user how to get the run's own settings back, a stop's epoch line dates its loss, a
# map-style dataset gets int indices, best.json counts epochs as the val rows do, early stopping at a step validation,
# a stateful stream resumes from its state at the save, a stream's loader workers end with the fit.
# 5,257 -> 4,768 (issue 40): the leaf support/ took the file format, the lock, the writers, the validator and the
# random state (what knows nothing of training); the rest of the way to 4,000 is real deletion in the loop.
# 4,768 -> 4,896 (issue 41, merged beside it): the validation cadence measured by its cost (evaluation.py) and the
# wall time split into steps, validation, checkpoints and the rest (finish.py)
# then issue 42: --strategy fsdp plugs in through layers.SHARDERS (+24 core lines), the package's APP_TOOLS moved to
# cli/app_tools.py (-28)
CORE_MAX_LINES = 4890


def _modules() -> dict[str, Path]:
    """Dotted name under trainer ('loop', 'compat.lightning') -> file."""
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path) -> list[tuple[str, list[str], bool]]:
    """(imported trainer module, names taken, at module level) for each relative import of `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".") if name else []
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [a.name for a in node.names]
            if not node.module:  # from . import knobs
                for n in names:
                    out.append((".".join([*base, n]), [], id(node) in top_level))
            else:
                out.append((target, names, id(node) in top_level))
    return out


def _layer(name: str) -> str | None:
    return name.split(".")[0] if name.split(".")[0] in LAYERS else None


def _leaf(name: str) -> bool:
    return name.split(".")[0] == LEAF


MODULES = _modules()


def test_the_core_imports_no_layer():
    bad = [
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if name not in DOORS and _layer(name) is None
        for target, _, _ in _imports(name, path)
        if _layer(target) is not None
    ]
    assert bad == [], "only the doors (__init__, __main__, base) may import the layers: " + "; ".join(bad)


def test_a_layer_takes_only_public_names_of_the_core():
    bad = [
        f"{name} takes {n} from {target}"
        for name, path in MODULES.items()
        if _layer(name) is not None
        for target, names, _ in _imports(name, path)
        if _layer(target) is None
        for n in names
        if n.startswith("_")
    ]
    assert bad == []


def test_no_trainer_module_is_imported_inside_a_function():
    bad = [
        f"{name} imports {target} inside a function"
        for name, path in MODULES.items()
        for target, _, top in _imports(name, path)
        if not top
    ]
    assert bad == []


def test_no_import_circles():
    graph = {
        name: {t for t, _, _ in _imports(name, path) if t in MODULES and t != name}
        for name, path in MODULES.items()
        if name  # trainer/__init__.py wires the layers in; nothing imports it back
    }
    seen: dict[str, int] = {}  # 1 on the path, 2 done
    cycles: list[str] = []

    def visit(n: str, path: list[str]) -> None:
        seen[n] = 1
        for m in sorted(graph.get(n, ())):
            if seen.get(m) == 1:
                cycles.append(" -> ".join([*path[path.index(m) :], m]))
            elif m not in seen:
                visit(m, [*path, m])
        seen[n] = 2

    for n in sorted(graph):
        if n not in seen:
            visit(n, [n])
    assert cycles == []


def test_no_private_member_is_used_across_modules():
    """A `_name` defined in one trainer module (a function, method or `self._attr`) is used only there."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for n in ast.walk(tree):
            own = n.name if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) else None
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and ast.unparse(n.value) == "self":
                own = n.attr
            if own and own.startswith("_") and not own.startswith("__"):
                owners.setdefault(own, set()).add(name)
    bad = [
        f"{name}:{n.lineno} {ast.unparse(n)} (defined in {', '.join(sorted(owners[n.attr]))})"
        for name, tree in trees.items()
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr in owners and name not in owners[n.attr]
    ]
    assert bad == [], "use a public name: " + "; ".join(bad)


def test_the_core_stays_readable():
    core = [p for name, p in MODULES.items() if _layer(name) is None and not _leaf(name) and name not in DOORS[1:]]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in core)
    assert lines <= CORE_MAX_LINES, f"the core is {lines} lines (at most {CORE_MAX_LINES}): move what is not the loop"


def test_the_leaf_imports_nothing_else_of_the_engine():
    bad = [
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if _leaf(name)
        for target, _, _ in _imports(name, path)
        if not _leaf(target)
    ]
    assert bad == [], "support/ is a leaf: it imports only itself (and torch, numpy, the stdlib)"


def test_only_the_core_imports_the_leaf():
    bad = [
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if _layer(name) is not None
        for target, _, _ in _imports(name, path)
        if _leaf(target)
    ]
    assert bad == [], "a layer takes the leaf's names from the core (trainer.checkpoint, .runfiles, .config)"


def test_the_leaf_has_a_closed_public_list():
    """support/__init__.py lists every name it takes from its modules in __all__, and only those."""
    tree = ast.parse(MODULES[LEAF].read_text(encoding="utf-8"))
    taken = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    listed = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
    )
    assert sorted(listed) == sorted(taken) and len(listed) == len(set(listed))


def test_the_leaf_knows_no_flag():
    """No string of the leaf names a command-line flag or the engine's config: callers add their own advice."""
    bad = []
    for name, path in MODULES.items():
        if _leaf(name):
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    if re.search(r"(^|\s)--[a-z]", n.value) or "TrainConfig" in n.value:
                        bad.append(f"{name}:{n.lineno} {n.value[:60]!r}")
    assert bad == []


def test_the_leaf_stays_small():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for n, p in MODULES.items() if _leaf(n))
    assert 0 < lines <= LEAF_MAX_LINES, f"support/ is {lines} lines (at most {LEAF_MAX_LINES})"


def test_no_function_is_over_80_lines():
    long = [
        f"{name}.{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for name, path in MODULES.items()
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > FUNCTION_MAX_LINES
    ]
    assert long == [], f"split them (at most {FUNCTION_MAX_LINES} lines each)"


def test_the_trainer_class_stays_readable():
    tree = ast.parse(MODULES["loop"].read_text(encoding="utf-8"))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    lines = trainer.end_lineno - trainer.lineno + 1
    assert lines <= TRAINER_MAX_LINES, f"Trainer is {lines} lines (at most {TRAINER_MAX_LINES}): move a part out"


def test_few_lines_run_past_100_characters():
    lines = [line for p in MODULES.values() for line in p.read_text(encoding="utf-8").splitlines()]
    share = sum(len(line) > 100 for line in lines) / len(lines)
    assert share <= LONG_LINE_MAX_SHARE, f"{share:.1%} of trainer/'s lines run past 100 characters: wrap them"


def test_the_benchmarks_stay_in_proportion():
    """benchmarks/ holds the harnesses behind quoted figures, sharing common.py: at most 4,575 lines (4,500 + the
    wall-shares harness of issue 41; fold or delete one to come back under 4,500)."""
    bench = ROOT.parent / "benchmarks"
    files = sorted([*bench.glob("*.py"), *bench.glob("*.sh")])
    lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
    assert files and lines <= 4575, f"benchmarks/ is {lines} lines (at most 4,575): fold or delete a harness"


def test_the_checker_sees_a_bad_import(tmp_path):
    """The walk above is not vacuous: it finds a core module importing a layer, and one inside a function."""
    f = tmp_path / "loop.py"
    f.write_text("from .compat.lightning import x\n\ndef g():\n    from .state import y\n", encoding="utf-8")
    found = _imports("loop", f)
    assert ("compat.lightning", ["x"], True) in found and ("state", ["y"], False) in found
    assert _layer("compat.lightning") == "compat" and _layer("state") is None


@pytest.mark.parametrize("name", ["Trainer", "TrainConfig", "Task", "BaseTrainer", "Callback"])
def test_the_documented_imports_keep_working(name):
    import trainer

    assert getattr(trainer, name).__name__ == name


def test_the_package_lists_every_measuring_tool():
    import trainer

    assert set(trainer.APP_TOOLS) <= set(trainer.__all__)

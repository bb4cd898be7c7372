"""The `plainloop` command that `pip install` makes, and the namespace of the command line and its built-in tasks.

Installed, this folder is the package `plainloop._app`, beside train_optimized.py and the folders tasks/, datasets/,
models/ and utils/ (see setup.py; under `pip install -e` they stay the repository's files). In the repository those
import each other by their folder names (`from utils.metrics import ...`) and the engine as `trainer`. Here they are
loaded as `plainloop._app.utils.metrics` and `plainloop`: `AppLoader` rewrites those imports as it compiles each
file, so no module of plainloop's ever takes a top-level name of the user's (`utils`, `datasets`, `models`, `tasks`,
`trainer`) — a task or script importing its own `utils`, or Hugging Face's `datasets`, gets its own.

`plainloop [flags]` trains (train_optimized.py's main()); `plainloop plot RUN_DIR` and `plainloop hardware` run the
tools; `python -m plainloop ...` is the same command.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PACKAGE = __name__  # plainloop._app
ENGINE = PACKAGE.rpartition(".")[0]  # plainloop
APP_NAMES = ("tasks", "datasets", "models", "utils", "train_optimized")  # what the repository imports by bare name


def app_dir() -> Path:
    """The folder that holds train_optimized.py and tasks/: this package installed, the repository under -e."""
    spec = importlib.util.find_spec(PACKAGE + ".tasks")
    if spec is None or spec.origin is None:
        raise SystemExit("plainloop: error: the command line's tasks are not installed: reinstall plainloop")
    return Path(spec.origin).resolve().parent.parent


def rename(module: str) -> str:
    """The name a repository import (`utils.metrics`, `trainer.config`) has inside this package."""
    top, dot, rest = module.partition(".")
    if top == "trainer":
        return ENGINE + dot + rest
    return f"{PACKAGE}.{module}" if top in APP_NAMES else module


class Renamer(ast.NodeTransformer):
    """`from utils.x import y` -> `from plainloop._app.utils.x import y`; `import utils.x as z` likewise."""

    def __init__(self, path: str) -> None:
        self.path = path

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level == 0 and node.module:
            node.module = rename(node.module)
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            new = rename(alias.name)
            if new != alias.name and alias.asname is None:  # `import utils.x` binds `utils`: no name to bind here
                raise ImportError(f"{self.path}:{node.lineno}: write `from {alias.name} import ...` or `import "
                                  f"{alias.name} as ...` (plainloop's own modules have no top-level name)")  # fmt: skip
            alias.name = new
        return node


class AppLoader(importlib.machinery.SourceFileLoader):
    """Compiles an app file with its imports renamed. Never from __pycache__: the repository's own runs cache the
    same file with its plain imports."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        tree = Renamer(path).visit(ast.parse(self.get_data(path), path))
        return compile(tree, path, "exec", dont_inherit=True)


class AppFinder(importlib.abc.MetaPathFinder):
    """Finds `plainloop._app.<tasks|datasets|models|utils|train_optimized>...` in the app's folder, for AppLoader."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        rest = name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE + ".") else ""
        if rest.partition(".")[0] not in APP_NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path if "." in rest else [self.root])
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = AppLoader(name, str(spec.origin))
        return spec


class EngineFallback(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`trainer` as the module `plainloop` itself, for a task file written in plainloop's repository (`from trainer
    import Task`) and run by the command from anywhere. Last in sys.meta_path: a `trainer` of the user's always wins."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        top = name.partition(".")[0]
        if top != "trainer" or (name != top and sys.modules.get(top) is not sys.modules.get(ENGINE)):
            return None
        real = importlib.import_module(ENGINE + name[len(top) :])
        spec = importlib.util.spec_from_loader(name, self, is_package=hasattr(real, "__path__"))
        if spec is not None:
            spec.loader_state = real
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return spec.loader_state

    def exec_module(self, module: Any) -> None:
        module.__spec__ = sys.modules[module.__name__].__spec__  # the real module's, not the alias's


def installed_here(script: str) -> bool:
    """Whether `script` (a train_optimized.py) is the one this package runs (the repository under pip install -e)."""
    return (app_dir() / "train_optimized.py").resolve() == Path(script).resolve()


def _early_stop(signum: int, frame: Any) -> None:
    """A stop signal while Python imports torch and the tasks: nothing exists yet; one line and exit."""
    os.write(2, f"[plainloop] {signal.Signals(signum).name} during start-up: stopped before training\n".encode())
    os._exit(128 + signum)


TOOLS = {
    "plot": ("utils.plot", "draw a run's plots: plainloop plot RUN_DIR (writes RUN_DIR/plots/*.png)"),
    "hardware": ("utils.system_report", "print this machine's hardware as Markdown (--json for JSON)"),
    "export": ("trainer.extras.fsdp", "a run's model as one weights_only file: plainloop export RUN_DIR [OUT]"),
}


def main(argv: list[str] | None = None) -> int:
    """The console entry point (pyproject.toml [project.scripts]) and `python -m plainloop`."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        tool = importlib.import_module(rename(TOOLS[argv[0]][0]))
        prog = f"{'python -m plainloop' if Path(sys.argv[0]).name == '__main__.py' else 'plainloop'} {argv[0]}"
        return int(tool.main(argv[1:], prog=prog))
    if argv[:1] == ["tools"]:
        print("\n".join(f"plainloop {name}: {what}" for name, (_, what) in TOOLS.items()))
        return 0
    if not any(isinstance(f, EngineFallback) for f in sys.meta_path):
        sys.meta_path.append(EngineFallback())
    for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP"):  # as train_optimized.py run as a program does
        if hasattr(signal, name) and signal.getsignal(getattr(signal, name)) != signal.SIG_IGN:
            signal.signal(getattr(signal, name), _early_stop)
    cli = importlib.import_module(rename("train_optimized"))  # its main() puts its own handlers in place
    try:
        return int(cli.main(argv))
    finally:
        cli.while_exiting()  # a signal during interpreter exit no longer changes the exit code


# at import, not in main(): a worker process started with "spawn" imports this package again and must find the names
if not any(isinstance(f, AppFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, AppFinder(app_dir()))

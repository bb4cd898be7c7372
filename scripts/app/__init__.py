"""The `plainloop` command that `pip install` makes: it runs train_optimized.py's main(), as `python train_optimized.py`.

Installed, this folder is the package `plainloop._app`, beside the command line and its built-in tasks
(train_optimized.py and tasks/, datasets/, models/, utils/; see setup.py). Those import each other by their plain
names and the engine as `trainer`, its folder's name in the repository. Importing this package (which only the
command does, and a worker process it spawns) makes those names importable, so `import plainloop` in a user's
program never shadows their own `datasets` or `utils`. Under `pip install -e` they are the repository's folders.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any


class EngineAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`trainer.x` is the module `plainloop.x` itself: one set of classes under both names, so a user's task built
    with `from plainloop import Task` is the `Task` the command line checks for."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "trainer" and not name.startswith("trainer."):
            return None
        real = importlib.import_module("plainloop" + name[len("trainer") :])
        spec = importlib.util.spec_from_loader(name, self, is_package=hasattr(real, "__path__"))
        if spec is not None:
            spec.loader_state = real.__spec__
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return sys.modules[spec.loader_state.name]

    def exec_module(self, module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state  # importlib gave the module the alias's spec: undo that


def app_dir() -> Path:
    """The folder that holds train_optimized.py and tasks/: this package installed, the repository under -e."""
    spec = importlib.util.find_spec(__name__ + ".tasks")
    if spec is None or spec.origin is None:
        raise SystemExit("plainloop: error: the command line's tasks are not installed: reinstall plainloop")
    return Path(spec.origin).resolve().parent.parent


def _early_stop(signum: int, frame: Any) -> None:
    """A stop signal while Python imports torch and the tasks: nothing exists yet; one line and exit."""
    os.write(2, f"[plainloop] {signal.Signals(signum).name} during start-up: stopped before training\n".encode())
    os._exit(128 + signum)


def main() -> None:
    """The console entry point (pyproject.toml [project.scripts])."""
    for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP"):  # as train_optimized.py run as a program does
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _early_stop)
    import train_optimized  # importable now (below); its main() puts its own handlers in place

    sys.exit(train_optimized.main())


# at import, not in main(): a worker process started with "spawn" imports this package again (the command's
# script is its __main__) and must find the same names
if not any(isinstance(f, EngineAlias) for f in sys.meta_path):
    sys.path.insert(0, str(app_dir()))  # what `python train_optimized.py` puts first
    sys.meta_path.insert(0, EngineAlias())

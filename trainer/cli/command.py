"""The command line's side of a resume: how the command is named in the engine's messages (`python
train_optimized.py --resume ...`, or `plainloop ...`) while it runs, so a printed resume or re-run line pastes as it
is; and a cheap look into a --resume target before the long set-up.

trainer/__init__.py plugs `resume_command` and `rerun_command` into the core (trainer/layers.py); without them the
core's messages name the Python call, as in a repository that copied only `trainer/`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from ..checkpoint import DIGEST_KEY, INTEGRITY_KEY, StateDict, checkpoint_file, load_checkpoint, not_a_checkpoint

_CLI = [False]  # set while train_optimized.main runs (also when a test calls it in-process)
_TASK_FLAG: list[str] = []  # a user task the CLI runs: its resume line names it (code from a run dir is not run)


@contextlib.contextmanager
def cli_session() -> Iterator[None]:
    """Messages inside name plainloop's command line (train_optimized.py --resume ...), not the Python call."""
    before, _CLI[0] = _CLI[0], True
    try:
        yield
    finally:
        _CLI[0] = before


def set_task_flag(spec: str | None) -> None:
    """The CLI runs the user task `spec` (module:function or path/file.py:function): the resume lines printed add
    `--task spec`, since a resume does not import a task its run directory names unless the command line names it."""
    _TASK_FLAG[:] = [spec] if spec else []


def uses_cli() -> bool:
    """This process runs plainloop's own CLI script (train_optimized.py), so its flags mean something."""
    return _CLI[0] or Path(sys.argv[0] if sys.argv else "").name in ("train_optimized.py", "plainloop")


def cli_script() -> str:
    """train_optimized.py as this process was started with it (`python ../plainloop/train_optimized.py` prints that
    path, so the printed commands run from the same directory), else its plain name."""
    arg = sys.argv[0] if sys.argv else ""
    return shlex.quote(arg) if Path(arg).name == "train_optimized.py" else "train_optimized.py"


def installed_command() -> str | None:
    """`plainloop` or `python -m plainloop` when this process is the installed command run so, else None."""
    here = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if here is not None and here.name == "plainloop":
        return "plainloop"
    if here is not None and here.name == "__main__.py" and here.resolve().parent == Path(__file__).resolve().parents[1]:
        return f"python -m {__package__.rpartition('.')[0]}"  # this folder's own __main__.py: -m plainloop
    return None


def cli_command(prefix: str = "python") -> str:
    """The start of a printed command: the installed command when this process is it, else the prefix (python, or
    a torchrun line) and the script."""
    if prefix == "python" and (command := installed_command()):
        return command
    return f"{prefix} {cli_script()}"


def resume_command(target: str | os.PathLike[str], prefix: str) -> str | None:
    """The command line that continues the run at `target`, when the command line runs."""
    if not uses_cli():
        return None
    task = "".join(f" --task {shlex.quote(t)}" for t in _TASK_FLAG)
    return f"{cli_command(prefix)} --resume {shlex.quote(str(target))}{task}"  # pastes as itself


def rerun_command(config_toml: str | os.PathLike[str]) -> str | None:
    """The command line that runs a run's config.toml again, when there is a command line here to run it."""
    if uses_cli() or Path("train_optimized.py").is_file():
        return f"{cli_command()} --config {shlex.quote(str(config_toml))}"
    return None


def peek_checkpoint(path: str | os.PathLike, whole_below: int = 64 * 2**20) -> StateDict:
    """Check, before a long set-up, that `path` (a file or a run directory) holds a plainloop checkpoint; returns its
    entries. A file under `whole_below` bytes is loaded as a resume loads it (digest checked); a larger one is read
    without its tensors (torch's zip format, memory-mapped: cheap at any size), its digest left to the resume's own
    load. Raises load_checkpoint's errors (missing, corrupt, pickled objects, not a plainloop checkpoint)."""
    file = checkpoint_file(path)
    if file.stat().st_size < whole_below:
        return load_checkpoint(file)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a zip-format checkpoint, damaged, or refused: the whole load names the cause
        return load_checkpoint(file)
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise not_a_checkpoint(file, ckpt)
    ckpt.pop(DIGEST_KEY, None)
    ckpt[INTEGRITY_KEY] = "unverified: read without its tensors (the resume checks the digest)"
    return ckpt

"""A user's own task on the CLI: `--task package.module:function` (tasks/__init__.py) and the doors it goes through."""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

import tasks
from trainer import TrainConfig

BUILDER = '''
"""A regression task of the user's own, in a package outside plainloop."""
import dataclasses
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer import Task, TrainConfig

TRAIN_DEFAULTS = {"epochs": 2, "batch_size": 16}


def build(cfg: TrainConfig, *, hidden: int = 8, noise: float = 0.1, act: Literal["relu", "tanh"] = "relu",
          dims: tuple[int, ...] = (4,), note: str | None = None, out: Path = Path("x"), scale=2, tag: str) -> Task:
    """A toy regression.

    Args:
        hidden: width of the hidden layer
        noise: standard deviation of the
            label noise
        act (str): activation
        tag: a label for the run
    """
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(96, dims[0], generator=g)
    y = x.sum(1, keepdim=True) * scale + noise * torch.randn(96, 1, generator=g)
    torch.manual_seed(cfg.seed)
    model = nn.Sequential(nn.Linear(dims[0], hidden), nn.ReLU() if act == "relu" else nn.Tanh(), nn.Linear(hidden, 1))
    return Task("regress", model, TensorDataset(x, y), TensorDataset(x[:32], y[:32]),
                info={"tag": tag, "out": str(out), "out_type": type(out).__name__, "note": note, "dims": list(dims)})


def not_a_task(*, n: int = 1):
    return n


def task_lookalike():
    @dataclasses.dataclass
    class Task:  # named Task, without the engine's fields
        name: str

    return Task("x")


def positional_only(a: int, /, b: int = 2):
    return None


def bad_annotation(*, model: nn.Module = None):
    return None


def clash(*, lr: float = 0.1):
    return None
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A package `userpkg` with module `regress` in a temporary folder, importable from the current directory."""
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "regress.py").write_text(textwrap.dedent(BUILDER))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_flags_from_signature_and_docstring(user_pkg):
    flags = {f.name: f for f in tasks.builder_flags("userpkg.regress:build")}
    assert list(flags) == ["hidden", "noise", "act", "dims", "note", "out", "scale", "tag"]  # not cfg
    assert flags["hidden"].annotation is int and flags["hidden"].default == 8 and not flags["hidden"].required
    assert flags["noise"].help == "standard deviation of the label noise"  # the continued line joined
    assert flags["act"].help == "activation" and flags["hidden"].help == "width of the hidden layer"
    assert flags["scale"].annotation is int  # no annotation: the default's type
    assert flags["tag"].required and flags["tag"].help == "a label for the run"


def test_build_passes_cfg_and_converts_values(user_pkg):
    cfg = TrainConfig(seed=3)
    task = tasks.build_task("userpkg.regress:build", cfg, tag="t1", dims=(5,), out="o.txt", hidden=4)
    assert task.name == "regress" and task.model[0].in_features == 5 and task.model[0].out_features == 4
    assert task.info["out_type"] in ("PosixPath", "WindowsPath") and task.info["dims"] == [5]
    assert tasks.user_train_defaults("userpkg.regress:build") == {"epochs": 2, "batch_size": 16}


def test_a_file_path_works_too(user_pkg):
    task = tasks.build_task("userpkg/regress.py:build", TrainConfig(), tag="f")
    assert task.name == "regress"


@pytest.mark.parametrize(
    "spec,kw,needle",
    [
        ("userpkg.regress", {}, "unknown task; use era5, reid or your own builder as package.module:function"),
        ("nopkg.mod:build", {}, "no module named 'nopkg'; run from the folder"),
        ("userpkg.regress:missing", {}, "has no 'missing'; its functions: build, not_a_task"),
        ("userpkg.regress:build", {}, "needs --tag"),
        ("userpkg.regress:not_a_task", {}, "returned int, not a Task; return Task(name, model"),
        ("userpkg.regress:task_lookalike", {}, "returned userpkg.regress.task_lookalike.<locals>.Task, not a Task"),
        ("userpkg.regress:positional_only", {}, "'a' is positional-only"),
        ("userpkg.regress:bad_annotation", {}, "'model' is annotated"),
        ("nowhere.py:build", {}, "no such file nowhere.py"),
        (":build", {}, "not a module:function pair"),
    ],
)
def test_bad_specs_are_one_clear_line(user_pkg, spec, kw, needle):
    with pytest.raises(tasks.TaskSpecError) as e:
        tasks.build_task(spec, TrainConfig(), **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_parameter_may_not_shadow_a_training_flag(user_pkg):
    flags = tasks.builder_flags("userpkg.regress:clash")
    with pytest.raises(tasks.TaskSpecError, match=r"parameter 'lr' has the name of the training flag --lr.*cfg\.lr"):
        tasks.check_flag_names("userpkg.regress:clash", flags, {"lr": "the training flag"})


def test_typed_signature_is_what_options_reads(user_pkg):
    from trainer.cli.options import function_parameters

    spec = "userpkg.regress:build"
    params = function_parameters(tasks.typed_signature(spec, tasks.builder_flags(spec)))
    assert params["scale"] == (int, 2) and params["tag"][1] is inspect.Parameter.empty


def test_spec_from_argv_reads_flag_config_and_resumed_run(user_pkg):
    assert tasks.spec_from_argv(["--task", "userpkg.regress:build"]) == "userpkg.regress:build"
    assert tasks.spec_from_argv(["--task=reid"]) is None and tasks.spec_from_argv([]) is None
    Path("c.toml").write_text('[run]\ntask = "userpkg.regress:build"\n')
    assert tasks.spec_from_argv(["--config", "c.toml"]) == "userpkg.regress:build"
    run = Path("runs/regress-1")
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text('[run]\ntask = "userpkg.regress:build"\n[task]\ntag = "a"\n')
    assert tasks.spec_from_argv(["--resume", str(run)]) == "userpkg.regress:build"
    assert tasks.spec_from_argv(["--resume", str(run / "checkpoints" / "last.pt")]) == "userpkg.regress:build"


def test_find_resumable_user_task_matches_the_recorded_builder(user_pkg):
    import os
    import time

    import torch

    def make(name, spec, finished=False, age=0.0):
        run = Path("runs") / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.toml").write_text(f'[run]\ntask = "{spec}"\n')
        torch.save({"model": {}, "step": 5}, run / "checkpoints" / "last.pt")
        t = time.time() - age
        os.utime(run / "checkpoints" / "last.pt", (t, t))
        if finished:  # trained to its end: the summary's steps reach the checkpoint's step
            (run / "summary.json").write_text('{"steps": 5}')
        return run

    make("regress-old", "userpkg.regress:build", age=100)
    newer = make("regress-new", "userpkg.regress:build", age=10)
    make("regress-done", "userpkg.regress:build", finished=True)
    make("other-1", "userpkg.other:build")
    assert tasks.find_resumable_user_task("runs", "userpkg.regress:build") == newer
    (newer / "checkpoints" / "last.pt").write_bytes(b"damaged")  # unreadable: passed over for the older run
    assert tasks.find_resumable_user_task("runs", "userpkg.regress:build") == Path("runs") / "regress-old"
    assert tasks.find_resumable_user_task("runs", "userpkg.none:build") is None


def test_task_label_is_a_safe_folder_name():
    assert tasks.task_label("userpkg.regress:build") == "userpkg.regress-build"
    assert tasks.task_label("a/b.py:fn") == "a-b.py-fn"


# ------------------------------------------------------------------------------------------- every door of the CLI
@pytest.fixture
def cli(user_pkg):
    """train_optimized with the user task registry restored afterwards (registration is per process)."""
    import train_optimized

    builders, modules = dict(tasks.TASK_BUILDERS), dict(tasks.USER_MODULES)
    yield train_optimized
    tasks.TASK_BUILDERS.clear()
    tasks.TASK_BUILDERS.update(builders)
    tasks.USER_MODULES.clear()
    tasks.USER_MODULES.update(modules)


QUIET = ["--no-progress_bar", "--no-plots", "--output_dir", "runs"]
SPEC = "userpkg.regress:build"


def only_run(prefix: str = "regress-") -> Path:
    (run,) = [p for p in Path("runs").iterdir() if p.name.startswith(prefix)]
    return run


@pytest.mark.slow
def test_every_door_of_the_cli(cli, capsys, monkeypatch):
    import json
    import os
    import subprocess

    from trainer.cli.options import load_config_file

    # --help --task: the builder's parameters with their help and defaults
    with pytest.raises(SystemExit) as e:
        cli.main(["--task", SPEC, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--hidden" in out and "width of the hidden layer (default: 8)" in out
    assert "--tag" in out and "required" in out

    # the flags: a required one missing is one line
    assert cli.main(["--task", SPEC, *QUIET]) == 2
    assert "needs --tag" in capsys.readouterr().err

    # a run: flags, TRAIN_DEFAULTS (epochs 2, batch 16), the recorded task spec and arguments
    assert cli.main(["--task", SPEC, "--tag", "a", "--hidden", "4", "--max_steps", "4", *QUIET]) == 0
    run = only_run()
    saved = load_config_file(run / "config.toml")
    assert saved["task"] == SPEC and saved["hidden"] == 4 and saved["tag"] == "a" and saved["batch_size"] == 16
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["task"] == "regress"

    # --resume RUN_DIR rebuilds the same task (hidden 4: the weights fit) and extends it; a task its config.toml
    # names runs only when the command line names it too (--task, or --trust_task)
    assert cli.main(["--resume", str(run), "--max_steps", "8", "--task", SPEC, *QUIET]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
    capsys.readouterr()

    # --resume auto finds the unfinished run of this task (a killed one: no summary.json)
    (run / "summary.json").unlink()
    assert cli.main(["--task", SPEC, "--resume", "auto", "--max_steps", "12", *QUIET]) == 0
    assert "resume" in capsys.readouterr().out and json.loads((run / "summary.json").read_text())["steps"] == 12

    # a config file naming the task; keys of its builder are config keys, a stray key is named
    Path("c.toml").write_text(f'[run]\ntask = "{SPEC}"\n[task]\ntag = "c"\nact = "tanh"\n[train]\nmax_steps = 2\n')
    assert cli.main(["--config", "c.toml", "--run_name", "fromfile", "--trust_task", *QUIET]) == 0
    assert load_config_file(Path("runs/fromfile/config.toml"))["act"] == "tanh"
    Path("bad.toml").write_text(f'[run]\ntask = "{SPEC}"\n[task]\ntag = "c"\nhiden = 3\n')
    assert cli.main(["--config", "bad.toml", "--trust_task", *QUIET]) == 2
    assert "hiden" in capsys.readouterr().err

    # the system report measures the user's task
    assert cli.main(["--task", SPEC, "--tag", "r", "--system_report", "--report_steps", "2", "--report_repeats", "1",
                     "--max_steps", "2", *QUIET]) == 0  # fmt: skip
    assert (only_run("userpkg.regress-build-report") / "report.md").is_file()
    capsys.readouterr()

    # the launcher, run from the folder that holds the package (it runs the CLI from the repository)
    root = Path(cli.__file__).resolve().parent
    env = {**os.environ, "SKIP_SETUP": "1", "TASK": SPEC, "OUTPUT_DIR": str(Path("runs").resolve()),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(root / "optimize_training.sh"), "--tag", "l", "--run_name", "launched", "--max_steps", "2",
         "--no-progress_bar", "--no-plots"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_config_file(Path("runs/launched/config.toml"))["task"] == SPEC


def test_a_bad_spec_on_the_cli_is_one_line(cli, capsys):
    assert cli.main(["--task", "userpkg.regress:nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --task userpkg.regress:nope: userpkg.regress has no 'nope'; its functions: build, not_a_task, "
                   "task_lookalike, positional_only, bad_annotation, clash"]  # fmt: skip
    assert cli.main(["--task", "userpkg.regress:not_a_task", *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("error: --task userpkg.regress:not_a_task: not_a_task returned int, not a Task; return "
                      "Task(name, model, train_set, val_set, ...) with Task from plainloop (or trainer)")  # fmt: skip
    assert not any(line.startswith(("Traceback", "  File")) for line in err)
    assert cli.main(["--task", "userpkg.regress:clash"]) == 2
    assert "the training flag --lr" in capsys.readouterr().err
    assert cli.main(["--task", "nonsense"]) == 2
    assert "unknown task" in capsys.readouterr().err


def test_a_resume_from_another_folder_says_the_recorded_task_path_is_relative(cli, capsys):
    """A run started with --task path/to/file.py:fn records that relative path; resumed from elsewhere, the one line
    says where the spec came from and how to point at the file, instead of only 'no such file' for a --task never
    typed."""
    run = Path("runs/elsewhere")
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text('[run]\ntask = "my/tasks.py:build"\n')
    assert cli.main(["--resume", str(run), "--trust_task"]) == 2
    err = capsys.readouterr().err
    assert (
        "no such file my/tasks.py" in err and "resumed run's config.toml" in err and "--task with the full path" in err
    )
    assert len(err.strip().splitlines()) == 1
    # typed on the command line, the spec is the user's own: no hint about recorded settings
    assert cli.main(["--task", "my/tasks.py:build", *QUIET]) == 2
    assert "resumed run's config.toml" not in capsys.readouterr().err


def test_help_shows_the_defaults_a_user_task_runs_with(cli, capsys):
    """TRAIN_DEFAULTS (epochs 2, batch 16 in the test builder) are what the run uses, so --help says so."""
    with pytest.raises(SystemExit):
        cli.main(["--task", SPEC, "--help-all"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 2, from the task's TRAIN_DEFAULTS)" in out and "(default: 16, from the task's" in out


# ------------------------------------------------------------------------------------------- a first hour's builder
UNSEEDED = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

from cnn import make_net  # a module beside this file, as a user's project has them

from trainer import Task


def build(*, hidden: int = 8) -> Task:
    """Draws its data and weights from the global RNG, seeding nothing itself."""
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1)
    return Task("unseeded", make_net(hidden), TensorDataset(x, y), TensorDataset(x[:16], y[:16]))
'''
CNN = """
from torch import nn


def make_net(hidden):
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))
"""


@pytest.fixture
def unseeded(tmp_path, monkeypatch):
    """mytask.py beside cnn.py in a folder that is not on sys.path, run from another folder."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "mytask.py").write_text(UNSEEDED)
    (proj / "cnn.py").write_text(CNN)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", list(sys.path))  # what the loader appends goes away with the test
    yield proj / "mytask.py"
    sys.modules.pop("cnn", None)


def test_a_builder_file_imports_the_modules_beside_it(unseeded):
    task = tasks.build_task(f"{unseeded}:build", TrainConfig(), hidden=5)
    assert task.name == "unseeded" and task.model[0].out_features == 5


def test_seed_seeds_a_builder_that_does_not_seed_itself(unseeded):
    import torch

    spec = f"{unseeded}:build"
    first = tasks.build_task(spec, TrainConfig(seed=7))
    torch.rand(100)  # the global RNG moves on between the two builds
    again = tasks.build_task(spec, TrainConfig(seed=7))
    other = tasks.build_task(spec, TrainConfig(seed=8))
    assert torch.equal(first.model[0].weight, again.model[0].weight)
    assert torch.equal(first.train_set.tensors[0], again.train_set.tensors[0])
    assert not torch.equal(first.model[0].weight, other.model[0].weight)


def test_two_identical_cli_runs_of_a_user_task_are_bit_identical(unseeded, monkeypatch):
    """The same command twice in one process (the global RNG has moved on in between): same weights, same losses."""
    import json

    import torch

    import train_optimized

    builders, modules = dict(tasks.TASK_BUILDERS), dict(tasks.USER_MODULES)
    monkeypatch.setattr(tasks, "TASK_BUILDERS", builders)
    monkeypatch.setattr(tasks, "USER_MODULES", modules)
    monkeypatch.setattr(train_optimized, "TASK_BUILDERS", builders)
    spec = f"{unseeded}:build"
    for name in ("a", "b"):
        argv = ["--task", spec, "--max_steps", "6", "--batch_size", "16", "--run_name", name, "--seed", "3", *QUIET]
        assert train_optimized.main(argv) == 0
        torch.rand(100)
    a, b = (torch.load(f"runs/{n}/checkpoints/last.pt", weights_only=True)["model"] for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [[r["loss"] for r in map(json.loads, Path(f"runs/{n}/metrics.jsonl").read_text().splitlines())
             if r.get("kind") == "train"] for n in ("a", "b")]  # fmt: skip
    assert rows[0] and rows[0] == rows[1]


# ------------------------------------------------------------------------------ a Task from another import of the engine
ELSEWHERE = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

from otherengine import Task  # the engine imported a second time, as plainloop or a copy of it under another name

MADE = []


def build(*, hidden: int = 4) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x.sum(1, keepdim=True)
    task = Task("elsewhere", nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1)),
                TensorDataset(x, y), TensorDataset(x[:16], y[:16]), info={"from": "otherengine"})
    MADE.append(task)
    return task
"""


@pytest.fixture
def other_engine(tmp_path, monkeypatch):
    """The engine's folder imported again as the package `otherengine` (its own module objects and classes), and a
    builder file elsewhere.py that returns otherengine.Task."""
    import importlib.util

    import trainer

    engine = Path(trainer.__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(
        "otherengine", engine / "__init__.py", submodule_search_locations=[str(engine)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "otherengine", module)
    spec.loader.exec_module(module)
    assert module.Task is not trainer.Task and module.Task.__module__ == "otherengine.task"
    (tmp_path / "elsewhere.py").write_text(ELSEWHERE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # what the loader appends goes away with the test
    yield tmp_path / "elsewhere.py"
    for name in [m for m in sys.modules if m.startswith("otherengine.") or m == "elsewhere"]:
        del sys.modules[name]


def test_a_task_from_another_import_of_the_engine_is_rebuilt_as_the_engines_own(other_engine):
    from trainer import Task

    spec = f"{other_engine}:build"
    task = tasks.build_task(spec, TrainConfig(), hidden=5)
    made = inspect.getmodule(tasks.load_builder(spec)).MADE[-1]
    assert type(task) is Task and type(made) is not Task and type(made).__name__ == "Task"
    assert task.model is made.model and task.train_set is made.train_set and task.info is made.info  # no copies
    assert task.model[0].out_features == 5


def test_a_task_from_another_import_of_the_engine_trains_on_the_cli(other_engine, monkeypatch):
    import json

    import train_optimized

    builders, modules = dict(tasks.TASK_BUILDERS), dict(tasks.USER_MODULES)
    monkeypatch.setattr(tasks, "TASK_BUILDERS", builders)
    monkeypatch.setattr(tasks, "USER_MODULES", modules)
    monkeypatch.setattr(train_optimized, "TASK_BUILDERS", builders)
    argv = ["--task", "elsewhere.py:build", "--max_steps", "3", "--batch_size", "16", "--run_name", "else", *QUIET]
    assert train_optimized.main(argv) == 0
    summary = json.loads(Path("runs/else/summary.json").read_text())
    assert summary["steps"] == 3 and summary["task"] == "elsewhere"

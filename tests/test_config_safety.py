"""Nothing in a file runs code, and config files are read with one clear line for each mistake.

A config file, a run's config.toml (what --resume reads) or a checkpoint's copy of the settings may name a task
(`task = "os:system"`); it is imported and called only when the command line names it too (--task) or says
--trust_task. The rest: the config reader's one-line messages (a wrong-case key, a huge number, a tab in YAML,
!!set, merge keys, a file over the limit in bytes, a huge list echoed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tasks
import train_optimized as cli
from trainer.checkpoint import atomic_save
from trainer.cli.options import MAX_CONFIG_BYTES, load_config_file
from trainer.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

EVILMOD = "from pathlib import Path\nPath('imported').write_text('evilmod ran')\ndef build(**kw):\n    pass\n"
# (the task a file names, its keys): each runs code if imported or called
ATTACKS = {
    "os_system": ("os:system", 'command = "touch touched"'),
    "getoutput": ("subprocess:getoutput", 'cmd = "touch touched"'),
    "evilmod": ("evilmod:build", ""),
}
BUILDER = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer import Task

TRAIN_DEFAULTS = {"epochs": 1, "batch_size": 8}


def build(*, hidden: int = 4) -> Task:
    x = torch.randn(32, 3)
    y = x.sum(1, keepdim=True)
    model = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    return Task("mine", model, TensorDataset(x[:24], y[:24]), TensorDataset(x[24:], y[24:]))
"""
QUIET = ["--no-progress_bar", "--no-plots", "--output_dir", "runs"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A scratch folder as the working directory (evilmod.py beside it, as in a received run), and the CLI's user
    task registry restored afterwards (registration is per process)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    Path("evilmod.py").write_text(EVILMOD)
    monkeypatch.delitem(sys.modules, "evilmod", raising=False)  # imported before (a failing run): imported afresh
    builders, modules = dict(tasks.TASK_BUILDERS), dict(tasks.USER_MODULES)
    yield tmp_path
    tasks.TASK_BUILDERS.clear()
    tasks.TASK_BUILDERS.update(builders)
    tasks.USER_MODULES.clear()
    tasks.USER_MODULES.update(modules)


def _nothing_ran() -> None:
    assert not Path("touched").exists(), "the shell command ran"
    assert not Path("imported").exists(), "evilmod was imported"


def _received_run(spec: str, keys: str, toml: bool = True) -> Path:
    """A run directory from someone else: a checkpoint that passes its check, config.toml naming `spec`."""
    run = Path("runs/got")
    settings = {"run": {"task": spec}, "task": dict(k.split(" = ") for k in [keys] if k)}
    atomic_save({"model": {}, "step": 0, "settings": settings}, run / "checkpoints" / "last.pt")
    if toml:
        (run / "config.toml").write_text(f'[run]\ntask = "{spec}"\n[task]\n{keys}\n')
    return run


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("via", ["config", "resume", "resume auto", "checkpoint"])
def test_a_task_named_by_a_file_is_not_imported_or_called(attack, via, here, capsys):
    spec, keys = ATTACKS[attack]
    run = _received_run(spec, keys, toml=via != "checkpoint")
    argv = {
        "config": ["--config", str(run / "config.toml")],
        "resume": ["--resume", str(run)],
        "resume auto": ["--resume", "auto", "--run_name", "got", "--output_dir", "runs"],
        "checkpoint": ["--resume", str(run)],  # no config.toml: the settings come from the checkpoint's copy
    }[via]
    before = sorted(p.name for p in here.rglob("*"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    _nothing_ran()
    assert spec in err[0] and "--trust_task" in err[0] and f"--task {spec}" in err[0], err
    assert via == "resume auto" or str(run) in err[0]  # the file (or the run) that names it
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in here.rglob("*")) == before  # nothing written


def test_trust_task_from_a_file_is_not_trust(here, capsys):
    Path("c.toml").write_text('[run]\ntask = "os:system"\ntrust_task = true\n[task]\ncommand = "touch touched"\n')
    assert cli.main(["--config", "c.toml"]) == 2
    _nothing_ran()


def test_a_task_named_on_the_command_line_or_trusted_runs(here, capsys):
    Path("safety_task.py").write_text(BUILDER)  # a name of its own: sys.modules keeps modules
    assert cli.main(["--task", "safety_task:build", "--run_name", "a", "--max_steps", "2", *QUIET]) == 0
    assert (
        "--task safety_task:build" in capsys.readouterr().out
    )  # the re-run line names it: the file alone would not run
    # the run's config.toml names it: --resume needs --task (or --trust_task) too
    assert cli.main(["--resume", "runs/a", "--max_steps", "3", *QUIET]) == 2
    assert "--trust_task" in capsys.readouterr().err
    assert cli.main(["--resume", "runs/a", "--max_steps", "3", "--task", "safety_task:build", *QUIET]) == 0
    assert cli.main(["--resume", "runs/a", "--max_steps", "4", "--trust_task", *QUIET]) == 0
    assert cli.main(["--config", "runs/a/config.toml", "--trust_task", "--run_name", "b", *QUIET]) == 0
    assert "running safety_task:build as the settings name it (--trust_task)" in capsys.readouterr().out
    assert Path("runs/b/summary.json").is_file()


# ------------------------------------------------------------------------------------------- config messages
def _error(tmp_path: Path, name: str, text: str | bytes) -> str:
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_config_file(f)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600, msg
    return msg


def test_a_wrong_case_key_gets_a_did_you_mean(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("LR = 0.01\n")
    with pytest.raises(ConfigError, match=r"did you mean lr"):
        cli.resolve_settings({"config": str(f)}, [])


def test_a_huge_integer_is_named_plainly(tmp_path):
    for name, text in (("c.toml", f"lr = {'9' * 5000}\n"), ("c.json", f'{{"lr": {"9" * 5000}}}'),
                       ("c.yaml", f"lr: {'9' * 5000}\n")):  # fmt: skip
        msg = _error(tmp_path, name, text)
        assert "digits" in msg and "sys.set_int_max_str_digits" not in msg and "int_max" not in msg, msg


def test_a_tab_in_yaml_names_its_line(tmp_path):
    pytest.importorskip("yaml")
    msg = _error(tmp_path, "c.yaml", "epochs: 2\nlr:\n\t0.1\n")
    assert "line 3" in msg and "tab" in msg, msg


def test_a_yaml_set_is_refused(tmp_path):
    pytest.importorskip("yaml")
    msg = _error(tmp_path, "c.yaml", "lon: !!set {1: null, 2: null}\n")
    assert "lon" in msg and "set" in msg and "list" in msg, msg


def test_a_yaml_merge_key_is_read(tmp_path):
    """`<<: *base` merges a block (explicit keys win); the block merged from is a template, not a setting."""
    pytest.importorskip("yaml")
    for text in (
        "base: &base\n  lr: 0.01\n  epochs: 3\ntrain:\n  <<: *base\n  epochs: 5\n",
        "base: &base {lr: 0.01, epochs: 3}\n<<: *base\nepochs: 5\n",
        "a: &a {lr: 0.01}\nb: &b {epochs: 3}\ntrain:\n  <<: [*a, *b]\n  epochs: 5\n",
    ):
        f = tmp_path / "c.yaml"
        f.write_text(text)
        assert load_config_file(f) == {"lr": 0.01, "epochs": 5}, text
    assert cli.resolve_settings({"config": str(f)}, [])["epochs"] == 5
    f.write_text("train: &t {lr: 0.01}\ntask:\n  <<: *t\n")  # our own tables are never dropped
    with pytest.raises(ConfigError, match="set twice"):
        load_config_file(f)


def test_a_file_over_the_limit_in_bytes_is_refused(tmp_path):
    # 6 M three-byte characters: 18 MiB of bytes, but fewer characters than the limit
    text = "# " + "€" * (MAX_CONFIG_BYTES // 3 + 2**20) + "\nlr = 0.01\n"
    assert len(text) < MAX_CONFIG_BYTES < len(text.encode())
    msg = _error(tmp_path, "c.toml", text)
    assert "16 MiB" in msg


def test_a_huge_list_is_not_echoed_whole(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"lon": [' + ", ".join(["1"] * 99_990) + "]}")
    with pytest.raises(ConfigError) as e:
        cli.resolve_settings({"config": str(f)}, [])
    assert len(str(e.value)) < 600 and "lon" in str(e.value), str(e.value)[:2000]

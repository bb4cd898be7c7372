"""Small defects of issue 39, each one line to fix: the launcher's MASTER_ADDR, a small or pseudo file system, a task
parameter called `name`, checkpoints/ as a symbolic link, save_top_k lowered on resume, best.pt announced before
it was saved, and the ERA5 reader's implausible values."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import tasks
import train_optimized as cli
from tests.helpers import toy_config
from trainer import Task, TrainConfig, Trainer
from trainer.config import ConfigError, check_output_dirs
from trainer.runfiles import RunDirError

ROOT = Path(__file__).resolve().parents[1]


def _task(n: int = 64) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    torch.manual_seed(0)
    return Task("toy", nn.Linear(4, 1), data, TensorDataset(x[:16], x[:16].sum(1, keepdim=True)))


# ------------------------------------------------------------------------------------------- the launcher
@pytest.mark.parametrize("addr", ["-x", "a b", "host;rm -rf", "a..", "$(id)"])
def test_the_launcher_refuses_a_master_addr_that_is_no_host(addr):
    env = {k: v for k, v in os.environ.items() if k not in ("NNODES", "MASTER_PORT", "NODE_RANK")}
    env.update(SKIP_SETUP="1", PLAINLOOP_DRY_RUN="1", NPROC_PER_NODE="2", MASTER_ADDR=addr)
    p = subprocess.run(["bash", str(ROOT / "optimize_training.sh")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("optimize_training.sh: error: MASTER_ADDR=") and len(p.stderr.splitlines()) == 1


@pytest.mark.parametrize("addr", ["10.0.0.1", "node-01.cluster", "fe80::1", "[::1]"])
def test_the_launcher_takes_host_names_and_addresses(addr):
    env = {**os.environ, "SKIP_SETUP": "1", "PLAINLOOP_DRY_RUN": "1", "NPROC_PER_NODE": "2", "MASTER_ADDR": addr}
    p = subprocess.run(["bash", str(ROOT / "optimize_training.sh")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "trainer/cli/torchrun.py" in p.stdout  # torchrun through the wrapper that exits 128+N on a signal


# ------------------------------------------------------------------------------------------- file systems
Usage = namedtuple("Usage", "total used free")


def test_a_small_empty_file_system_is_not_called_full_and_exits_4(tmp_path, monkeypatch):
    """A 10 MiB file system with nothing on it was "full" and exit 2; it is a storage problem (exit 4) that says
    both sizes."""
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10 * 2**20, 0, 10 * 2**20))
    with pytest.raises(ConfigError) as e:
        check_output_dirs([("--output_dir", tmp_path)])
    assert "has 10.0 MiB free of 10.0 MiB; a run needs at least 16 MiB free" in str(e.value)
    assert "full" not in str(e.value)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    assert cli.exit_code(e.value) == 4


def test_a_pseudo_file_system_is_a_bad_path_exit_2(tmp_path, monkeypatch):
    """/sys/kernel (writable for root, size 0) was "full"; it is a wrong folder: exit 2, saying what it is."""
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, 0))
    with pytest.raises(ConfigError) as e:
        check_output_dirs([("--cache_dir", tmp_path)])
    assert "is on a pseudo file system (size 0, like /proc or /sys), not a disk" in str(e.value)
    assert cli.exit_code(e.value) == 2


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="as root /sys/kernel passes os.access")
def test_sys_kernel_as_root_is_named_a_pseudo_file_system():
    if not os.path.isdir("/sys/kernel"):
        pytest.skip("no /sys/kernel")
    with pytest.raises(ConfigError, match="pseudo file system"):
        check_output_dirs([("--cache_dir", "/sys/kernel/plainloop-cache")])


def test_checkpoints_as_a_symbolic_link_is_refused(tmp_path):
    """The saves (and the pruning of old checkpoints) went through the link to wherever it pointed."""
    Trainer(toy_config(tmp_path, epochs=1), _task()).fit()
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "checkpoints").rename(elsewhere)
    (run / "checkpoints").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    with pytest.raises(RunDirError, match=r"checkpoints is a symbolic link \(to .*elsewhere\): a run writes"):
        Trainer(toy_config(tmp_path, epochs=2, resume=str(run)), _task()).fit()
    assert sorted(p.name for p in elsewhere.iterdir()) == before


# ------------------------------------------------------------------------------------------- tasks and checkpoints
def test_a_task_parameter_called_name_is_passed_on(tmp_path, monkeypatch):
    """build_task(name, cfg, **kw) took `--name foo` as its own first argument: a TypeError traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "named.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\nfrom trainer import Task\n"
        "def build(cfg, *, name: str = 'x', cfg_note: str = ''):\n"
        "    x = torch.zeros(8, 2)\n"
        "    return Task(name, nn.Linear(2, 1), TensorDataset(x, x[:, :1]))\n"
    )
    assert tasks.build_task("named.py:build", TrainConfig(), name="foo").name == "foo"


def test_save_top_k_lowered_on_resume_prunes_to_the_new_k(tmp_path, capsys):
    """Lowered to 1 (best.pt alone), the kept epoch=...pt files stayed for ever."""
    t = Trainer(toy_config(tmp_path, epochs=3, batch_size=32, save_top_k=3), _task())
    t.fit()
    ckpts = tmp_path / "run" / "checkpoints"
    assert len(list(ckpts.glob("epoch=*.pt"))) > 1
    capsys.readouterr()
    Trainer(toy_config(tmp_path, epochs=4, batch_size=32, save_top_k=1, resume=str(tmp_path / "run")), _task()).fit()
    assert list(ckpts.glob("epoch=*.pt")) == [] and (ckpts / "best.pt").is_file()
    assert "[plainloop] save_top_k 1: removed epoch=" in capsys.readouterr().out


def test_best_pt_is_announced_only_once_saved(tmp_path, capsys):
    """A full disk at best.pt printed "best.pt saved" and then the error."""
    t = Trainer(toy_config(tmp_path, epochs=1), _task())
    real = t._save

    def save(name, background=False):
        if name == "best.pt":
            raise OSError(errno.ENOSPC, "No space left on device", name)
        real(name, background)

    t._save = save
    with pytest.raises(OSError):
        t.fit()
    assert "best.pt saved" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "change,said",
    [
        ({"step": -5}, "holds step -5, not a whole number >= 0"),
        ({"format": "plainloop-9"}, "holds format 'plainloop-9' (this plainloop reads plainloop-2 and plainloop-1)"),
        ("nan", "holds non-finite values in the model's 'weight'"),
    ],
)
def test_a_checkpoint_with_a_recomputed_digest_and_values_no_run_writes_is_refused(tmp_path, change, said):
    """An edited checkpoint whose digest was computed again loaded without a word (step -5, a newer format, NaN
    weights) and trained on."""
    from trainer.checkpoint import atomic_save
    from trainer.state import ResumeError

    Trainer(toy_config(tmp_path, epochs=1), _task()).fit()
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    ck = torch.load(last, weights_only=True)
    ck.pop("digest", None)
    if change == "nan":
        ck["model"]["weight"][0, 0] = float("nan")
    else:
        ck.update(change)
    atomic_save(ck, last)
    with pytest.raises(ResumeError) as e:
        Trainer(toy_config(tmp_path, epochs=2, resume=str(tmp_path / "run")), _task()).fit()
    assert str(e.value) == f"{last} {said}: no plainloop run writes that; resume from another checkpoint"


# ------------------------------------------------------------------------------------------- ERA5 files
def test_era5_says_how_many_implausible_values_it_masked(tmp_path):
    """inf and 5000 °C cells were masked as missing (right) without a word (a unit slip or a broken file hid)."""
    import netCDF4
    import numpy as np

    from datasets.era5 import ERA5SSTMonthlyDataset
    from datasets.era5_sample import write_sample_file

    p = write_sample_file(tmp_path / "raw.nc", layout="cf", grid=10.0, months=24, seed=3)
    with netCDF4.Dataset(p, "a") as nc:
        a = nc["sst"][:].filled(np.nan)
        a[0, 5, 5], a[1, 5, 6], a[2, 6, 6] = np.inf, 5000.0, 5000.0
        nc["sst"][:] = a
    kw = dict(data_path=p, cache_dir=tmp_path / "cache", resolution=10.0, split=None, lon=[-180, 180], lat=[-80, 80])
    ds = ERA5SSTMonthlyDataset(**kw)
    assert ds.notes == [
        "data: 3 source value(s) outside -5..45 °C (inf, a fill value, a unit slip) masked as missing, like land; "
        "check the files if that is more than a few"
    ]
    assert ERA5SSTMonthlyDataset(**kw).notes == ds.notes  # from the cache too


def test_an_unwritable_plainloop_cache_is_named(tmp_path, monkeypatch):
    """It said "[Errno 20] Not a directory: '.../cache'", naming neither $PLAINLOOP_CACHE nor what to do."""
    from datasets.free_space import make_cache_dir

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PLAINLOOP_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(OSError) as e:
        make_cache_dir(None)
    assert str(e.value).startswith(f"cache folder {tmp_path / 'file' / 'cache'} ($PLAINLOOP_CACHE) cannot be made: ")
    assert str(e.value).endswith("point --cache_dir or $PLAINLOOP_CACHE at a folder you can write")
    with pytest.raises(OSError, match=r"\(--cache_dir \(cache_dir=\)\) cannot be made"):
        make_cache_dir(tmp_path / "file" / "c2")


# ------------------------------------------------------------------------------------------- Task(metrics=...)
def test_a_metric_name_that_is_no_name_blames_the_name(tmp_path):
    with pytest.raises(ValueError) as e:
        Trainer(toy_config(tmp_path), Task("t", nn.Linear(4, 1), _task().train_set, metrics={"a/b c": lambda o, t: o}))
    assert str(e.value) == "Task(metrics=...): 'a/b c' is not a plain name; use letters, digits, _ ('top5')"


def test_a_metric_of_the_wrong_shape_is_refused_not_averaged(tmp_path):
    """(o - t).abs() with o (N, 1) and t (N,) broadcasts to (N, N): its mean was reported as the score."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = TensorDataset(x, x.sum(1))  # targets (N,), the model's output (N, 1)
    task = Task("t", nn.Linear(4, 1), data, data, loss_fn=lambda m, b: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),
                metrics={"mae": lambda o, t: (o - t).abs()})  # fmt: skip
    with pytest.raises(ValueError) as e:
        Trainer(toy_config(tmp_path, epochs=1, batch_size=16), task).fit()
    assert str(e.value) == (
        "Task(metrics=...) 'mae' on val: gave shape (16, 16) for a batch of 16; return one value per sample "
        "(shape (16,)) or the batch's mean (a 0-d tensor)"
    )


@pytest.mark.parametrize(
    "criterion, shown", [(F.cross_entropy, "cross_entropy"), (nn.CrossEntropyLoss(), "nn.CrossEntropyLoss()")]
)
def test_a_criterion_of_output_and_target_as_loss_fn_is_one_line_with_the_way_in(criterion, shown, tmp_path):
    """loss_fn takes (model, batch): a torch criterion handed over as it is would fail at the first step with a
    traceback about a Linear not being a Tensor."""
    from trainer.compat.nanogpt import ModelProtocolError

    data = TensorDataset(torch.randn(8, 2), torch.tensor([0, 1] * 4))
    way_in = rf"give loss_fn=lambda m, b: {re.escape(shown)}\(m\(b\[0\]\), b\[1\]\)"
    with pytest.raises(ModelProtocolError, match=way_in):
        Trainer(toy_config(tmp_path / "a", max_steps=1), Task("t", nn.Linear(2, 2), data, loss_fn=criterion))
    assert not (tmp_path / "a").exists()  # refused before the run directory
    task = Task("t", nn.Linear(2, 2), data, loss_fn=lambda m, b: criterion(m(b[0]), b[1]))  # the way in
    assert Trainer(toy_config(tmp_path / "b", max_steps=1, batch_size=4), task).fit()["steps"] == 1

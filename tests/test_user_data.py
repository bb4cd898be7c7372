"""Users' data and repos as they are: streams, their own samplers resumed exactly, validation caps and warnings,
the AdamW knobs and decay horizon, final metrics, and `trainer/` copied under another package name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from tests.helpers import metric_rows
from trainer import Task, TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(tmp_path, **kw):
    base = dict(batch_size=16, num_workers=0, output_dir=str(tmp_path), run_name="run", progress_bar=False,
                log_every=5, warmup_steps=0, lr_decay_steps=1000)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))


def pairs(n=320, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True).sin())


def same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def fit(c, model, train, val=None, **task_kw):
    t = Trainer(c, Task("mine", model, train, val, **task_kw), log=lambda s: None)
    return t, t.fit()


# ------------------------------------------------------------------ streams
class Stream(IterableDataset):
    """A deterministic endless stream of (x, y) pairs."""

    def __iter__(self):
        g = torch.Generator().manual_seed(7)
        while True:
            x = torch.randn(4, generator=g)
            yield x, x.sum(0, keepdim=True).sin()


def test_a_stream_trains_with_max_steps_and_resumes_exactly(tmp_path):
    a, b = net(), net()
    fit(cfg(tmp_path / "a", max_steps=40), a, Stream(), pairs(64))
    fit(cfg(tmp_path / "b", max_steps=20), b, Stream(), pairs(64))
    c = net()
    t, s = fit(cfg(tmp_path / "b", max_steps=40, resume=str(tmp_path / "b" / "run")), c, Stream(), pairs(64))
    assert t.step == 40 and same(a, c)  # the stream was replayed past the 20 batches already trained
    assert "val_loss" in s["final_metrics"]


def test_a_stream_without_max_steps_is_told_an_endless_one_needs_it(tmp_path):
    """A stream without len() trains one pass an epoch (tests/test_streams_and_stops.py); the start-up says so."""
    t = Trainer(cfg(tmp_path, epochs=2), Task("mine", net(), Stream()), log=lambda s: None)
    assert any("an endless stream needs max_steps" in n for n in t.notes)


# ------------------------------------------------------------------ the user's own batch sampler
class RandomBatches:
    """A batch sampler with its own RNG, as research code writes them: the order depends on the RNG's state."""

    def __init__(self, n, batch_size, seed):
        self.n, self.bs, self.rng = n, batch_size, np.random.default_rng(seed)
        self.epoch, self.skip = 0, 0

    def __len__(self):
        return self.n // self.bs

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = self.rng.permutation(self.n)
        skip, self.skip = self.skip, 0
        for b in range(skip, len(self)):
            yield order[b * self.bs : (b + 1) * self.bs]

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "epoch": self.epoch}

    def load_state_dict(self, state):
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        self.epoch, self.skip = state.get("epoch", 0), state.get("batches_done", 0)


class Stateless(RandomBatches):
    """The same order rule from (seed, epoch) only, and no state_dict."""

    state_dict = load_state_dict = None  # type: ignore[assignment]

    def __init__(self, n, batch_size, seed):
        super().__init__(n, batch_size, seed)
        self.seed = seed
        del self.rng

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        for b in range(len(self)):
            yield order[b * self.bs : (b + 1) * self.bs]


@pytest.mark.parametrize("sampler", [RandomBatches, Stateless])
def test_own_batch_sampler_resumes_exactly_mid_epoch(tmp_path, sampler):
    if sampler is Stateless:
        del Stateless.state_dict, Stateless.load_state_dict  # no attribute at all, as a user's class has none
        Stateless.state_dict = property(lambda self: (_ for _ in ()).throw(AttributeError))  # hasattr -> False
        Stateless.load_state_dict = property(lambda self: (_ for _ in ()).throw(AttributeError))

    def fn(ds, bs, seed, rank, world, drop_last):
        return sampler(len(ds), bs, seed)

    data = pairs()  # 20 batches per epoch
    a = net()
    fit(cfg(tmp_path / "a", max_steps=50, device_cache=False), a, data, batch_sampler_fn=fn)
    b = net()
    t, _ = fit(cfg(tmp_path / "b", max_steps=30, device_cache=False), b, data, batch_sampler_fn=fn)  # mid-epoch 2
    c = net()
    t, _ = fit(cfg(tmp_path / "b", max_steps=50, resume=str(tmp_path / "b" / "run"), device_cache=False), c, data,
               batch_sampler_fn=fn)  # fmt: skip
    assert same(a, c)
    noted = any("no state_dict/load_state_dict" in n for n in t.notes)
    assert noted == (sampler is Stateless)


# ------------------------------------------------------------------ validation: caps, warnings, final metrics
def test_final_metrics_hold_the_last_validation_when_val_check_steps_divides_max_steps(tmp_path):
    _, s = fit(cfg(tmp_path, max_steps=40, val_check_steps=20), net(), pairs(), pairs(64, 1))
    assert set(s["final_metrics"]) == {"val_loss"}


def test_limit_val_batches_caps_the_default_validation(tmp_path):
    seen = []

    def loss(model, batch):
        if not model.training:
            seen.append(len(batch[0]))
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    fit(cfg(tmp_path, epochs=1, limit_val_batches=3, validation_interval=1), net(), pairs(64), pairs(640, 1),
        loss_fn=loss)  # fmt: skip
    assert seen == [16, 16, 16]


def test_a_validation_longer_than_the_training_is_named_once(tmp_path, monkeypatch):
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "SLOW_VALIDATION_S", 0.0)  # this one takes milliseconds
    lines = []
    c = cfg(tmp_path, epochs=3, validation_interval=1)
    Trainer(c, Task("mine", net(), pairs(32), pairs(20_000, 1)), log=lines.append).fit()
    warned = [ln for ln in lines if "longer than the" in ln]
    assert len(warned) == 1 and "limit_val_batches" in warned[0]


def test_a_validation_of_milliseconds_gets_no_advice(tmp_path, monkeypatch):
    """At a few milliseconds, validation "longer than training" is noise: the README's small example once said so."""
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "SLOW_VALIDATION_S", 3600.0)  # no validation here takes an hour
    lines = []
    Trainer(cfg(tmp_path, epochs=3, validation_interval=1), Task("mine", net(), pairs(32), pairs(20_000, 1)),
            log=lines.append).fit()  # fmt: skip
    assert not [ln for ln in lines if "longer than the" in ln]


# ------------------------------------------------------------------ the built-in AdamW
def test_adamw_knobs_and_a_decay_horizon_apart_from_the_run_length(tmp_path):
    c = cfg(tmp_path, max_steps=30, lr=0.1, warmup_steps=2, lr_decay_steps=10, min_lr_ratio=0.1, adam_betas=(0.8, 0.9),
            adam_eps=1e-6, fused=False, log_every=1)  # fmt: skip
    t, _ = fit(c, net(), pairs())
    g = t.optimizer.param_groups[0]
    assert g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6 and not t.optimizer.defaults["fused"]
    lrs = {r["step"]: r["lr"] for r in metric_rows(tmp_path / "run") if r["kind"] == "train"}
    assert lrs[10] == pytest.approx(0.01) and lrs[30] == pytest.approx(0.01)  # the cosine ended at step 10
    assert lrs[5] > lrs[9] > 0.01
    conf = json.loads((tmp_path / "run" / "config.json").read_text())
    assert conf["optimizer"]["param_groups"][0]["betas"] == [0.8, 0.9]


# ------------------------------------------------------------------ copying trainer/ under another name
SCRIPT = """
import sys, torch
from torch import nn
from torch.utils.data import TensorDataset
import trainer                                    # the repo's own trainer package
from src.plainloop_trainer import Task, TrainConfig, Trainer
assert trainer.OWN == "mine"
x = torch.randn(256, 4)
task = Task("mine", nn.Linear(4, 1), TensorDataset(x, x.sum(1, keepdim=True)))
cfg = TrainConfig(epochs=2, batch_size=32, output_dir="runs", run_name="copied", progress_bar=False, num_workers=0)
t = Trainer(cfg, task)
t.fit()
from src.plainloop_trainer.usercode import resume_hint
print("HINT", resume_hint(t.run_dir))
"""


@pytest.mark.slow
def test_trainer_works_copied_under_another_package_name(tmp_path):
    repo = tmp_path / "research"
    (repo / "trainer").mkdir(parents=True)
    (repo / "trainer" / "__init__.py").write_text('OWN = "mine"\n', encoding="utf-8")
    (repo / "src").mkdir()
    (repo / "src" / "__init__.py").write_text("", encoding="utf-8")
    shutil.copytree(ROOT / "trainer", repo / "src" / "plainloop_trainer", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "train.py").write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run([sys.executable, "train.py"], cwd=repo, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "train_optimized.py" not in proc.stdout + proc.stderr  # no CLI advice where there is no CLI
    hint = [ln for ln in proc.stdout.splitlines() if ln.startswith("HINT")][0]
    assert "TrainConfig(..., resume=" in hint and "python train.py again" in hint
    toml = (repo / "runs" / "copied" / "config.toml").read_text(encoding="utf-8")
    assert "train_optimized.py" not in toml


def test_auto_workers_pick_0_for_data_held_in_memory_and_cheap_to_index_only():
    from torch.utils.data import Dataset, Subset

    from trainer.usercode import auto_workers_for

    class Windows(Dataset):
        def __init__(self):
            self.tokens = torch.arange(10_000)

        def __len__(self):
            return 9_000

        def __getitem__(self, i):
            return self.tokens[i : i + 8], self.tokens[i + 1 : i + 9]

    class Files(Windows):  # reads "files": nothing held in memory, never probed
        def __init__(self):
            self.paths = [f"/data/{i}.nc" for i in range(9_000)]

        def __getitem__(self, i):
            raise AssertionError("probed a file-backed dataset in the main process")

    workers, note = auto_workers_for(Windows())
    assert workers == 0 and "us per sample (measured)" in note
    assert auto_workers_for(Subset(Windows(), range(100)))[0] == 0
    assert auto_workers_for(Files()) == (None, None)


class CountedStream(IterableDataset):
    """A stream that keeps its position and can be put back at it (state_dict/load_state_dict)."""

    def __init__(self):
        self.pos, self.seen = 0, []

    def __iter__(self):
        while True:
            g = torch.Generator().manual_seed(self.pos)
            x = torch.randn(4, generator=g)
            self.seen.append(self.pos)
            self.pos += 1
            yield x, x.sum(0, keepdim=True).sin()

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def test_a_stateful_stream_continues_where_the_stop_left_it(tmp_path):
    """Stopped at step 12, it resumes at sample 12 x 16: it was put back at its position of the epoch's start (0)
    and trained its first samples again."""
    import os
    import signal

    from trainer.finish import TrainingStopped

    class StopAt:
        def on_log(self, trainer, row):
            if row.get("kind") == "train" and row["step"] == 12:
                os.kill(os.getpid(), signal.SIGTERM)

    a, b, c = net(), net(), net()
    fit(cfg(tmp_path / "a", max_steps=40, log_every=4), a, CountedStream())
    first = CountedStream()
    t = Trainer(cfg(tmp_path / "b", max_steps=40, log_every=4), Task("mine", b, first), callbacks=[StopAt()])
    with pytest.raises(TrainingStopped):
        t.fit()
    assert first.seen == list(range(12 * 16))
    again = CountedStream()
    fit(cfg(tmp_path / "b", max_steps=40, log_every=4, resume=str(tmp_path / "b" / "run")), c, again)
    assert again.seen[0] == 12 * 16 and same(a, c)


def test_a_stream_read_by_workers_lets_the_process_exit_after_fit(tmp_path):
    """The run stops mid-stream; its loader workers (which ignore stop signals) must end with the fit, or the
    interpreter's exit waits for them for ever."""
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from torch import nn\nfrom torch.utils.data import IterableDataset\n"
        "from trainer import Task, TrainConfig, Trainer\n"
        "class S(IterableDataset):\n"
        "    def __iter__(self):\n"
        "        while True:\n"
        "            x = torch.randn(4)\n"
        "            yield x, x.sum(0, keepdim=True)\n"
        f"cfg = TrainConfig(max_steps=4, batch_size=8, num_workers=2, output_dir={str(tmp_path)!r}, progress_bar=False)\n"
        "print(Trainer(cfg, Task('s', nn.Linear(4, 1), S()), log=lambda m: None).fit()['steps'])\n",
        encoding="utf-8",
    )
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stderr[-2000:]

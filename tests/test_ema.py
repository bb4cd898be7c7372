"""EMA of weights (trainer/extras/ema.py): timm's decay schedule, the update, buffers, every-N, state and the swap."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers import cut_short
from trainer.extras.ema import EMA, ema_decay_at

pytestmark = pytest.mark.usefixtures("one_thread")


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def train_steps(model: nn.Module, steps: int, seed: int = 1):
    """Yield after each of `steps` SGD steps on random data (the weights and BN statistics move)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for s in range(1, steps + 1):
        x = torch.randn(16, 4, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield s


def timm_reference(step, decay, power=2 / 3, gamma=1.0, after=0, min_decay=0.0, warmup=True):
    """timm ModelEmaV3.get_decay, written out independently."""
    t = step - after - 1
    if t <= 0:
        return 0.0
    if not warmup:
        return decay
    d = 1 - (1 + t / gamma) ** (-power)
    return max(min(d, decay), min_decay)


@pytest.mark.parametrize("power,gamma,after", [(2 / 3, 1.0, 0), (0.75, 1.0, 0), (1.0, 10.0, 5)])
def test_decay_schedule_is_timm_model_ema_v3(power, gamma, after):
    for step in (0, 1, 2, 3, 10, 100, 10_000, 10**6):
        want = timm_reference(step, 0.999, power, gamma, after)
        assert ema_decay_at(step, 0.999, True, power, gamma, after) == pytest.approx(want, abs=0)
    # the first update copies the weights; warm-up rises monotonically to the cap
    assert ema_decay_at(1, 0.999) == 0.0
    ds = [ema_decay_at(s, 0.999) for s in range(2, 50_000, 97)]
    assert all(a <= b for a, b in zip(ds, ds[1:])) and ds[-1] == 0.999
    assert ema_decay_at(5, 0.9, warmup=False) == 0.9
    # timm's note: power 3/4 reaches 0.999 at about 10k steps
    assert ema_decay_at(10_001, 0.9999, warmup_power=0.75) == pytest.approx(0.999, abs=1e-6)


def test_update_matches_a_plain_reference_loop_with_buffers():
    model = small_net()
    ema = EMA(decay=0.99)
    ema.attach(model)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    for step in train_steps(model, 12):
        ema.update(step)
        d = timm_reference(step, 0.99)
        for k, v in model.state_dict().items():
            ref[k] = d * ref[k] + (1 - d) * v if v.is_floating_point() else v.clone()
    got = ema.state_dict()["weights"]
    assert set(got) == set(model.state_dict())
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-6, atol=1e-7)
    # the average differs from the weights (it lags), the BN statistics are averaged, the counter is copied
    assert not torch.equal(got["0.weight"], model[0].weight)
    assert not torch.equal(got["1.running_mean"], model[1].running_mean)
    assert int(got["1.num_batches_tracked"]) == 12
    assert ema.updates == 12 and ema.last_step == 12


def test_buffers_copied_when_not_averaged():
    model = small_net()
    ema = EMA(decay=0.99, average_buffers=False)
    ema.attach(model)
    for step in train_steps(model, 5):
        ema.update(step)
    got = ema.state_dict()["weights"]
    assert torch.equal(got["1.running_mean"], model[1].running_mean)
    assert not torch.equal(got["0.weight"], model[0].weight)


def test_every_n_steps_updates_on_multiples_only():
    model = small_net()
    ema = EMA(decay=0.9, every=3, warmup=False)
    ema.attach(model)
    ref = {k: v.clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    for step in train_steps(model, 10):
        ema.catch_up(step)  # what on_train_batch_end does
        if step % 3 == 0:
            d = timm_reference(step, 0.9, warmup=False)
            for k in ref:
                ref[k] = d * ref[k] + (1 - d) * model.state_dict()[k]
    assert ema.updates == 3 and ema.last_step == 10
    got = ema.state_dict()["weights"]
    for k in ref:
        torch.testing.assert_close(got[k], ref[k])
    ema.catch_up(10)  # already there: nothing happens
    assert ema.updates == 3


def test_state_dict_resumes_exactly():
    """10 updates straight == 6, a state_dict round trip into a fresh EMA (loaded before it saw the model), 4."""
    m1 = small_net()
    straight = EMA(decay=0.95)
    straight.attach(m1)
    for step in train_steps(m1, 10):
        straight.update(step)

    m2 = small_net()
    first = EMA(decay=0.95)
    first.attach(m2)
    steps = train_steps(m2, 10)
    for step in steps:
        first.update(step)
        if step == 6:
            break
    state = copy.deepcopy(first.state_dict())
    second = EMA(decay=0.95)
    second.load_state_dict(state)  # as on resume: before the model is seen
    second.attach(m2)
    assert second.last_step == 6 and second.updates == 6
    for step in steps:
        second.update(step)
    for k, v in straight.state_dict()["weights"].items():
        assert torch.equal(v, second.state_dict()["weights"][k]), k


def test_swapped_in_scores_the_average_and_restores_the_weights_exactly():
    model = small_net()
    ema = EMA(decay=0.9)
    ema.attach(model)
    for step in train_steps(model, 8):
        ema.update(step)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    model.eval()
    with ema.swapped_in():
        inside = {k: v.clone() for k, v in model.state_dict().items()}
        y_ema = model(x)
    for k, v in ema.state_dict()["weights"].items():
        assert torch.equal(inside[k], v)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.allclose(model(x), y_ema)


def test_update_and_swap_do_not_sync_the_device(monkeypatch):
    """The hot-path rule: an update reads nothing back from the device."""
    model = small_net()
    ema = EMA(decay=0.99)
    ema.attach(model)
    calls = []
    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _o=orig, _n=name, **k: calls.append(_n) or _o(t, *a, **k))
    for step in range(1, 20):
        ema.update(step)
    assert calls == []


@pytest.mark.parametrize(
    "kw,needle",
    [({"decay": 1.0}, "decay=1.0"), ({"decay": -0.1}, "decay=-0.1"), ({"every": 0}, "every=0"),
     ({"warmup_power": 0}, "warmup_power=0"), ({"min_decay": 0.9999, "decay": 0.9}, "min_decay=0.9999")],
)  # fmt: skip
def test_bad_settings_name_the_argument(kw, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        EMA(**kw)


def test_a_checkpoint_of_another_model_is_a_clear_error():
    ema = EMA(decay=0.9)
    ema.attach(small_net())
    other = EMA(decay=0.9)
    other.attach(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="another model"):
        ema.load_state_dict(other.state_dict())


def test_config_errors_name_the_config_field():
    from trainer.config import TrainConfig

    for bad in (1.5, 1.0):  # decay 1 would never move the average
        with pytest.raises(
            ValueError, match=rf"TrainConfig: ema_decay={bad}: must be below 1; use a number in \[0, 1\)"
        ):
            EMA.from_config(TrainConfig(ema_decay=bad))
    ema = EMA.from_config(TrainConfig(ema_decay=0.99, ema_every=4, ema_warmup_power=0.5))
    assert (ema.decay, ema.every, ema.warmup_power) == (0.99, 4, 0.5)


# ------------------------------------------------------------------------------------------- in the Trainer
def ema_task(seed: int = 0):
    """A toy regression with its own evaluate_fn (val_mse, higher noise so the average matters)."""
    from torch.utils.data import TensorDataset

    from trainer import Task

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(192, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.5 * torch.randn(192, 1, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

    def evaluate(m, split, device):
        xs, ys = (x[:64], y[:64]) if split == "val" else (x[64:128], y[64:128])
        return {f"{split}_mse": float((m(xs.to(device)) - ys.to(device)).pow(2).mean())}

    held = TensorDataset(x[:64], y[:64])
    return Task("toy", model, TensorDataset(x, y), held, held, evaluate_fn=evaluate, monitor_metric="val_mse")


def scores_with(weights: dict, split: str, seed: int = 0) -> float:
    task = ema_task(seed)
    task.model.load_state_dict(weights)
    task.model.eval()
    with torch.no_grad():
        return task.evaluate_fn(task.model, split, torch.device("cpu"))[f"{split}_mse"]


def test_best_pt_holds_the_ema_and_the_trained_weights(tmp_path):
    from tests.helpers import metric_rows, toy_config
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    t = Trainer(toy_config(tmp_path, epochs=4, ema_decay=0.9, lr=0.05), ema_task())
    summary = t.fit()
    vals = [r for r in metric_rows(t.run_dir) if r["kind"] == "val"]
    assert len(vals) == 4 and all("raw_val_mse" in r and "val_mse" in r for r in vals)
    assert any(r["val_mse"] != r["raw_val_mse"] for r in vals)
    best = load_checkpoint(t.run_dir / "checkpoints" / "best.pt")
    ema_w, raw_w = best["callbacks"]["EMA"]["weights"], best["model"]
    # best.pt was chosen on the EMA score, and holds both: each scores what the row of its step says
    row = next(r for r in vals if r["step"] == best["step"])
    assert row["val_mse"] == min(r["val_mse"] for r in vals)
    assert scores_with(ema_w, "val") == pytest.approx(row["val_mse"], rel=1e-6)
    assert scores_with(raw_w, "val") == pytest.approx(row["raw_val_mse"], rel=1e-6)
    # the test split: EMA under the usual name, the trained weights beside it
    final = summary["final_metrics"]
    last = load_checkpoint(t.run_dir / "checkpoints" / "last.pt")
    assert final["test_mse"] == pytest.approx(scores_with(last["callbacks"]["EMA"]["weights"], "test"), rel=1e-6)
    assert final["raw_test_mse"] == pytest.approx(scores_with(last["model"], "test"), rel=1e-6)
    assert any("ema: weights averaged with decay 0.9" in n for n in summary["notes"])


def test_test_with_best_scores_best_pts_average(tmp_path):
    from tests.helpers import toy_config
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    t = Trainer(toy_config(tmp_path, epochs=4, ema_decay=0.9, lr=0.05, test_with_best=True), ema_task())
    final = t.fit()["final_metrics"]
    best = load_checkpoint(t.run_dir / "checkpoints" / "best.pt")
    assert final["test_mse"] == pytest.approx(scores_with(best["callbacks"]["EMA"]["weights"], "test"), rel=1e-6)
    assert final["raw_test_mse"] == pytest.approx(scores_with(best["model"], "test"), rel=1e-6)


@pytest.mark.parametrize("every,accum", [(1, 1), (3, 2)])
def test_resume_continues_the_average_exactly(tmp_path, every, accum):
    """4 epochs straight == 2 epochs, then a resume for 2 more: the EMA weights bit for bit, and the scores."""
    from tests.helpers import metric_rows, toy_config
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    kw = dict(epochs=4, ema_decay=0.95, ema_every=every, accumulate_grad_batches=accum)
    straight = Trainer(toy_config(tmp_path, run_name="straight", **kw), ema_task())
    straight.fit()
    first = Trainer(toy_config(tmp_path, run_name="split", **kw), ema_task())
    cut_short(first, max_epochs=2)  # interrupted after epoch 2
    first.fit()
    Trainer(toy_config(tmp_path, run_name="split", resume=str(tmp_path / "split"), **kw), ema_task()).fit()
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["callbacks"]["EMA"]
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")["callbacks"]["EMA"]
    assert a["updates"] == b["updates"] and a["last_step"] == b["last_step"]
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), k
    val = lambda d: [(r["step"], r["val_mse"], r["raw_val_mse"]) for r in metric_rows(d) if r["kind"] == "val"]  # noqa: E731
    assert val(tmp_path / "straight") == val(tmp_path / "split")


def test_ema_added_on_resume_starts_from_the_resumed_weights(tmp_path):
    from tests.helpers import toy_config
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    first = Trainer(toy_config(tmp_path, epochs=3), ema_task())
    cut_short(first, max_epochs=1)
    first.fit()
    second = Trainer(toy_config(tmp_path, epochs=3, ema_decay=0.9, resume=str(first.run_dir)), ema_task())
    summary = second.fit()
    assert any("holds no EMA state; the average starts from the weights at step 6" in n for n in summary["notes"])
    state = load_checkpoint(first.run_dir / "checkpoints" / "last.pt")["callbacks"]["EMA"]
    assert state["last_step"] == 18 and state["updates"] == 12  # steps 7..18


def test_no_host_sync_from_the_ema_during_training(tmp_path, monkeypatch):
    from tests.helpers import toy_config
    from trainer.loop import Trainer

    t = Trainer(toy_config(tmp_path, epochs=2, ema_decay=0.99, log_every=1000, validation_interval=100), ema_task())
    calls = []
    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        orig = getattr(torch.Tensor, name)

        def wrapper(x, *a, _o=orig, _n=name, **k):
            import sys

            if sys._getframe(1).f_code.co_filename.endswith("trainer/extras/ema.py"):
                calls.append(_n)
            return _o(x, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    t.fit()
    assert t.step > 0 and calls == []


DDP_SCRIPT = """
import json, sys
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer import Task, TrainConfig, Trainer
from trainer.runtime import cleanup_distributed

g = torch.Generator().manual_seed(0)
x = torch.randn(256, 8, generator=g)
y = x.sum(1, keepdim=True) + 0.3 * torch.randn(256, 1, generator=g)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

def evaluate(m, split, device):
    return {f"{split}_mse": float((m(x[:64].to(device)) - y[:64].to(device)).pow(2).mean())}

held = TensorDataset(x[:64], y[:64])
task = Task("toy", model, TensorDataset(x, y), held, held, evaluate_fn=evaluate, monitor_metric="val_mse")
cfg = TrainConfig(epochs=2, batch_size=16, num_workers=0, output_dir=sys.argv[1], run_name="ddp", progress_bar=False,
                  validation_interval=1, ema_decay=0.9, lr=0.05)
Trainer(cfg, task).fit()
cleanup_distributed()
"""


@pytest.mark.slow
def test_ddp_average_on_rank0_keeps_the_ranks_identical(tmp_path):
    """torchrun, 2 processes (gloo): rank 0 keeps the average and swaps it in to validate; the trained weights stay
    identical on both ranks, and the scores of both kinds reach summary.json."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers import metric_rows

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "ddp_ema.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ddp_max_weight_diff"] == 0.0
    assert {"test_mse", "raw_test_mse"} <= set(summary["final_metrics"])
    vals = [r for r in metric_rows(tmp_path / "ddp") if r["kind"] == "val"]
    assert len(vals) == 2 and all(r["val_mse"] != r["raw_val_mse"] for r in vals)


def test_the_cli_names_the_ema_decay_flag_for_a_decay_of_one_or_more(capsys):
    """The [0, 1) rule lives with the knob, so the command line refuses it at parse time, naming --ema_decay."""
    import train_optimized as cli

    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--ema_decay", "1.5"])
    assert e.value.code == 2 and "argument --ema_decay: 1.5: must be below 1" in capsys.readouterr().err

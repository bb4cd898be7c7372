"""EMA of weights (trainer/ema.py): timm's decay schedule, the update, buffers, every-N, state and the swap."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainer.ema import EMA, ema_decay_at

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

    with pytest.raises(ValueError, match=r"TrainConfig: ema_decay=1\.5; use a number in \[0, 1\)"):
        EMA.from_config(TrainConfig(ema_decay=1.5))
    ema = EMA.from_config(TrainConfig(ema_decay=0.99, ema_every=4, ema_warmup_power=0.5))
    assert (ema.decay, ema.every, ema.warmup_power) == (0.99, 4, 0.5)

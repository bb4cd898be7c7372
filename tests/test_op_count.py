"""The SST model's launches per training step (benchmarks/op_count.py) do not grow back, and the layout that cut
them left float32 results as they were: the model is checked against its earlier formulation, kept here."""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.op_count import main, profile_model_step
from models.ratransformer import RecursiveAttentionTransformer
from tasks.era5 import PriorForecaster

H, W = 10, 18  # not multiples of the patch (4): the padding path runs too
# (prediction, loss, gradients by name, the prediction in eval mode)
Run = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor]


def _net(**kw: Any) -> RecursiveAttentionTransformer:
    args: dict[str, Any] = dict(width=W, height=H, seq_len=3, d_model=32, num_heads=4, num_layers=2,
                                dim_feedforward=48, dropout=0.1, recursion_depth=2, patch_size=4)  # fmt: skip
    args.update(kw)
    net = RecursiveAttentionTransformer(**args)
    mask = torch.ones(H, W, dtype=torch.bool)
    mask[:2, :5] = False
    net.set_ocean_mask(mask)
    return net


def _batch(calendar: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, H, W, generator=g)
    y = torch.randn(3, H, W, generator=g)
    y[0, 2, 3] = float("nan")
    if calendar:
        phase = 2 * math.pi * torch.tensor([1.0, 6.0, 11.0]) / 12
        cal = torch.stack([phase.cos(), phase.sin()], 1)[:, :, None, None].expand(3, 2, H, W)
        x = torch.cat([x, cal], 1)
    return x, y


# ------------------------------------------------------------------------------------------ the earlier formulation
def _old_block(b: Any, x: torch.Tensor) -> torch.Tensor:
    B, N, D = x.shape
    qkv = b.qkv(b.norm1(x)).view(B, N, 3, b.num_heads, D // b.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=b.dropout if b.training else 0.0)
    x = x + b.drop(b.proj(a.transpose(1, 2).reshape(B, N, D)))
    return x + b.drop(b.fc2(F.gelu(b.fc1(b.norm2(x)))))


def _old_calendar(m: RecursiveAttentionTransformer, cal: torch.Tensor) -> torch.Tensor:
    back = m.lead + torch.arange(m.in_channels - 1, -1, -1, dtype=torch.float32)
    target = torch.atan2(cal[:, 1].float(), cal[:, 0].float())
    phases = torch.cat([target[:, None] - 2 * math.pi * back / 12.0, target[:, None]], dim=1)
    return torch.cat([phases.cos(), phases.sin(), (2 * target[:, None]).cos(), (2 * target[:, None]).sin()], 1)


def _old_forward(m: RecursiveAttentionTransformer, x: torch.Tensor) -> torch.Tensor:
    cal = x[:, m.in_channels :, 0, 0] if m.calendar else None
    x = x[:, : m.in_channels]
    B, C, _, _ = x.shape
    p, gh, gw = m.patch_size, m.grid_h, m.grid_w
    xp = F.pad(x, (0, gw * p - W, 0, gh * p - H), mode="replicate")
    tokens = xp.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)
    h = m.patch_embed(tokens) + m.pos_proj(m.sh_features)
    if cal is not None:
        h = h + m.cal_proj(_old_calendar(m, cal))[:, None, :]
    h = m.emb_drop(h)
    for _ in range(m.recursion_depth):
        for layer in m.layers:
            h = _old_block(layer, h)
    out = m.head(m.norm(h)).reshape(B, gh, gw, p, p).permute(0, 1, 3, 2, 4).reshape(B, gh * p, gw * p)[:, :H, :W]
    return out + x[:, -1] if m.residual else out


def _old_loss(m: RecursiveAttentionTransformer, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    valid = m.ocean_mask & torch.isfinite(target)
    diff = torch.where(valid, pred.float() - target.float(), 0.0)
    return diff.square().sum() / valid.sum().clamp_min(1)


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor],
         loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Run:  # fmt: skip
    torch.manual_seed(1)  # the same dropout masks for both: the two draw in the same order
    model.train()
    model.zero_grad(set_to_none=True)
    pred = forward(x)
    value = loss(pred, y)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.eval()
    with torch.no_grad():
        evaluated = forward(x)
    return pred.detach(), value.detach(), grads, evaluated


@pytest.mark.parametrize("kw", [{}, {"calendar": True, "lead": 2}, {"residual": True, "dropout": 0.0}])
def test_the_model_matches_its_earlier_formulation_in_float32(kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    m = _net(**kw)
    x, y = _batch(m.calendar)
    new = _run(m, x, y, m, m.loss)
    old = _run(m, x, y, lambda t: _old_forward(m, t), lambda p, t: _old_loss(m, p, t))
    for a, b in ((new[0], old[0]), (new[1], old[1]), (new[3], old[3])):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert new[2].keys() == old[2].keys()
    for k in new[2]:
        torch.testing.assert_close(new[2][k], old[2][k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("members", [1, 3])
def test_the_task_model_matches_its_earlier_formulation_in_float32(members: int) -> None:
    torch.manual_seed(0)
    nets = [_net(calendar=True, residual=False) for _ in range(members)]
    pf = PriorForecaster(nets, "damped_persistence", {"damping": torch.full((H, W), 0.7)}, fields=2)
    x, y = _batch(True)

    def old_forward(t: torch.Tensor) -> torch.Tensor:
        if not pf.training:
            corr = torch.stack([_old_forward(n, t) for n in nets]).mean(0)
            return pf.prior_forecast(t) + pf.correction_scale * corr
        return torch.stack([_old_forward(n, t) for n in nets]) + pf.prior_forecast(t)

    def old_loss(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.stack([_old_loss(nets[0], q, t) for q in p]).mean()

    new, old = _run(pf, x, y, pf, pf.loss), _run(pf, x, y, old_forward, old_loss)
    for a, b in ((new[0], old[0]), (new[1], old[1]), (new[3], old[3])):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # one member: the same bits; three: rounding
    for k in new[2]:
        torch.testing.assert_close(new[2][k], old[2][k], rtol=1e-6, atol=1e-7)


def test_autocast_keeps_the_embedding_head_and_residual_stream_in_float32() -> None:
    torch.manual_seed(0)
    m = _net(calendar=True)
    x, y = _batch(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
        m.loss(out, y).backward()
    assert out.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


# ------------------------------------------------------------------------------------------ the counts
# One forward, loss and backward of the task's model (one member, calendar on), counted the way a GPU launches
# (benchmarks/op_count.py: CUDA's autocast rules, fused attention and dropout once). Counts are exact: no timing,
# no load dependence. Before the layout change the same step counted (bf16) 201 launches, 64 of them casts or
# copies, and (float32) 147 launches, 10 copies.
BUDGET = {"bf16-mixed": {"kernels": 161, "cast_copy_kernels": 36}, "32": {"kernels": 133, "cast_copy_kernels": 8}}


@pytest.mark.parametrize("precision", sorted(BUDGET))
def test_launches_per_step_do_not_grow(precision: str) -> None:
    torch.manual_seed(0)
    pf = PriorForecaster([_net(calendar=True, residual=False, num_layers=1)], "damped_persistence",
                         {"damping": torch.full((H, W), 0.7)}, fields=2)  # fmt: skip
    x, y = _batch(True)
    counts = profile_model_step(pf, x, y, precision, policy="cuda")
    got = {k: counts[k] for k in BUDGET[precision]}
    assert all(got[k] <= v for k, v in BUDGET[precision].items()), (got, counts["cast_copy_sites"])


@pytest.mark.slow
def test_the_harness_counts_the_steps_of_plainloops_loop(tmp_path: Path) -> None:
    """benchmarks.op_count end to end: two steps of plainloop's Trainer profiled, each part of a step counted."""
    s = main(["--steps", "2", "--warmup", "1", "--top", "5", "--out", str(tmp_path / "oc.json")])["per_step"]
    assert s["steps"] == 2 and (tmp_path / "oc.md").is_file()
    assert {"forward", "loss", "backward", "optimizer", "loop"} <= set(s["kernels_by_phase"])
    assert 0 < s["cast_copy_kernels"] < s["kernels"] < s["aten_ops"] and len(s["cast_copy_sites"]) == 5

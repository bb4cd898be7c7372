"""RecursiveAttentionTransformer: shapes, shared weights, masked loss, SDPA use, FLOP count, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from models.ratransformer import DEFAULT_PATCH_SIZE, RecursiveAttentionTransformer
from models.spherical_harmonics import real_spherical_harmonics


def tiny(**kw: object) -> RecursiveAttentionTransformer:
    args: dict[str, object] = dict(
        width=24,
        height=12,
        seq_len=2,
        d_model=32,
        num_heads=4,
        num_layers=2,
        dim_feedforward=64,
        dropout=0.0,
        recursion_depth=2,
        patch_size=4,
        lat_range=(-60.0, 60.0),
        sh_degree=3,
    )
    args.update(kw)
    return RecursiveAttentionTransformer(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "height,width,seq_len,patch",
    [(12, 24, 2, 4), (13, 25, 3, 4), (7, 10, 2, 3), (32, 72, 2, 4), (5, 5, 4, 8), (6, 9, 2, 1)],
)
@pytest.mark.parametrize("residual", [True, False])
def test_output_shape_including_non_divisible_grids(
    height: int, width: int, seq_len: int, patch: int, residual: bool
) -> None:
    torch.manual_seed(0)
    m = tiny(width=width, height=height, seq_len=seq_len, patch_size=patch, residual=residual)
    x = torch.randn(3, seq_len - 1, height, width)
    y = m(x)
    assert y.shape == (3, height, width)
    assert torch.isfinite(y).all()
    assert m.num_tokens == -(-height // patch) * -(-width // patch)


def test_seed_config_token_count_and_default_patch() -> None:
    m = RecursiveAttentionTransformer(
        width=180, height=80, seq_len=2, d_model=64, num_heads=8, num_layers=1,
        dim_feedforward=64, dropout=0.1, recursion_depth=2, learning_rate=1e-3,
    )  # fmt: skip
    assert m.patch_size == DEFAULT_PATCH_SIZE
    assert (m.grid_h, m.grid_w) == (80 // DEFAULT_PATCH_SIZE, 180 // DEFAULT_PATCH_SIZE)
    assert m.learning_rate == 1e-3


def test_recursion_shares_weights() -> None:
    counts = {d: sum(p.numel() for p in tiny(recursion_depth=d).parameters()) for d in (1, 2, 5)}
    assert counts[1] == counts[2] == counts[5]
    # ... and the stack really is applied recursion_depth times.
    m = tiny(recursion_depth=3)
    calls = [0] * m.num_layers
    for i, layer in enumerate(m.layers):
        layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    m(torch.randn(1, 1, 12, 24))
    assert calls == [3] * m.num_layers


def test_deeper_recursion_changes_output_with_the_same_weights() -> None:
    torch.manual_seed(0)
    a = tiny(recursion_depth=1).eval()
    b = tiny(recursion_depth=2).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 1, 12, 24)
    assert not torch.allclose(a(x), b(x))


def test_loss_ignores_land_and_nan_targets() -> None:
    torch.manual_seed(0)
    m = tiny()
    mask = torch.rand(12, 24) > 0.4
    m.set_ocean_mask(mask)
    pred = torch.randn(3, 12, 24, requires_grad=True)
    target = torch.randn(3, 12, 24)
    target[0, 2, 3] = float("nan")
    target[1, :, 5] = float("nan")
    loss = m.loss(pred, target)
    assert torch.isfinite(loss)
    valid = mask.expand(3, -1, -1) & torch.isfinite(target)
    expected = (pred.detach()[valid] - target[valid]).square().mean()
    torch.testing.assert_close(loss.detach(), expected)

    # Changing the prediction on land (even to NaN/inf) leaves the loss unchanged.
    pred2 = pred.detach().clone()
    pred2[:, ~mask] = torch.randn(3, int((~mask).sum())) * 100
    pred2[0, ~mask] = float("nan")
    pred2[2, ~mask] = float("inf")
    torch.testing.assert_close(m.loss(pred2, target), loss.detach())

    # Gradient w.r.t. land / NaN-target cells is exactly zero and nowhere NaN.
    loss.backward()
    assert torch.isfinite(pred.grad).all()
    assert (pred.grad[~valid] == 0).all()
    assert (pred.grad[valid] != 0).any()


def test_ocean_mask_is_a_buffer_saved_in_state_dict() -> None:
    m = tiny()
    mask = torch.zeros(12, 24, dtype=torch.bool)
    mask[3:9, 4:20] = True
    m.set_ocean_mask(mask)
    assert "ocean_mask" in dict(m.named_buffers())
    other = tiny()
    other.load_state_dict(m.state_dict())
    assert torch.equal(other.ocean_mask, mask)


def test_gradient_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    m = tiny(dropout=0.1)
    x = torch.randn(2, 1, 12, 24)
    m.loss(m(x), torch.randn(2, 12, 24)).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_eval_is_deterministic_and_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    m = tiny(dropout=0.3)
    x = torch.randn(2, 1, 12, 24)
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(m(x), m(x), rtol=0, atol=0)
    m.train()
    with torch.no_grad():
        assert not torch.allclose(m(x), m(x))


def test_sdpa_is_used_with_dropout_only_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = F.scaled_dot_product_attention

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(float(kwargs.get("dropout_p", 0.0)))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    m = tiny(dropout=0.2, num_layers=3, recursion_depth=2)
    x = torch.randn(1, 1, 12, 24)
    m.train()
    m(x)
    assert seen == [0.2] * 6
    seen.clear()
    m.eval()
    m(x)
    assert seen == [0.0] * 6


def test_positional_encoding_is_sh_at_patch_centres() -> None:
    m = tiny(width=8, height=4, patch_size=2, lat_range=(-40.0, 40.0), lon_range=(0.0, 80.0), sh_degree=2)
    buffers = dict(m.named_buffers())
    assert "sh_features" in buffers and "sh_features" not in m.state_dict()  # recomputed, never stale
    # 4 rows of 20 deg from -40: patch rows centred at -20, 20; 8 columns of 10 deg: centres 10, 30, 50, 70
    lat = torch.tensor([-20.0, 20.0]).repeat_interleave(4)
    lon = torch.tensor([10.0, 30.0, 50.0, 70.0]).repeat(2)
    torch.testing.assert_close(m.sh_features, real_spherical_harmonics(lat, lon, 2))
    assert m.sh_features.shape == (m.num_tokens, 9)


def test_flops_match_flop_counter() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m = tiny(width=26, height=14, seq_len=3).eval()  # non-divisible: padded tokens count too
    x = torch.randn(2, 2, 14, 26)
    # The math backend spells attention as bmm, which FlopCounterMode counts on a CPU.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc, torch.no_grad():
        m(x)
    counts = fc.get_flop_counts()
    pos = sum(counts["RecursiveAttentionTransformer.pos_proj"].values())  # batch-shared, not per sample
    assert fc.get_total_flops() - pos == pytest.approx(2 * m.flops_per_sample(training=False))
    assert m.flops_per_sample(training=True) == pytest.approx(3 * m.flops_per_sample(training=False))


def test_tiny_model_overfits_a_fixed_batch() -> None:
    torch.manual_seed(0)
    m = tiny(num_layers=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 12, 24, generator=g)
    y = torch.randn(4, 12, 24, generator=g)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    with torch.no_grad():
        first = float(m.loss(m(x), y))
    for _ in range(100):
        loss = m.loss(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = float(m.loss(m(x), y))
    assert last < first / 10, (first, last)


def test_bad_arguments_and_inputs_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match="num_head"):
        tiny(num_head=4)
    with pytest.raises(ValueError, match="num_heads"):
        tiny(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="seq_len"):
        tiny(seq_len=1)
    with pytest.raises(ValueError, match="lat_range"):
        tiny(lat_range=(-100.0, 80.0))
    with pytest.raises(ValueError, match="dropout"):
        tiny(dropout=1.5)
    with pytest.raises(ValueError, match="learning_rate"):
        tiny(learning_rate=-1.0)
    m = tiny()
    with pytest.raises(ValueError, match=r"\(B, 1, 12, 24\)"):
        m(torch.randn(2, 12, 24))
    with pytest.raises(TypeError, match="BoolTensor"):
        m.set_ocean_mask(torch.ones(12, 24))
    with pytest.raises(ValueError, match="height=12"):
        m.set_ocean_mask(torch.ones(12, 25, dtype=torch.bool))
    with pytest.raises(ValueError, match="pred"):
        m.loss(torch.zeros(2, 12, 24), torch.zeros(2, 12, 23))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to detect host-device syncs")
def test_cuda_step_has_no_host_sync() -> None:
    m = tiny().cuda()
    m.set_ocean_mask(torch.rand(12, 24) > 0.3)
    x = torch.randn(2, 1, 12, 24, device="cuda")
    y = torch.randn(2, 12, 24, device="cuda")
    y[0, 0, 0] = float("nan")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m.loss(m(x), y)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


# ------------------------------------------------------------------ dateline areas and the Area door
@pytest.fixture(scope="module")
def nino_file(tmp_path_factory):
    from datasets.era5_sample import write_sample_file

    d = tmp_path_factory.mktemp("nino")
    return write_sample_file(d / "sample.nc", grid=1.0, months=14, seed=5), d / "cache"


@pytest.mark.parametrize(
    "lon,res",
    [((170, -120), 1.0), ((170, -120), 5.0), ((-180, 180), 5.0), ((0, 360), 5.0), ((200, 340), 5.0)],
)
def test_positions_equal_the_datasets_cell_longitudes(nino_file, lon, res) -> None:
    from datasets.area import Area
    from datasets.era5 import ERA5SSTMonthlyDataset

    path, cache = nino_file
    lat = (-5, 5) if res == 1.0 else (-20, 20)
    ds = ERA5SSTMonthlyDataset(lon=list(lon), lat=list(lat), resolution=res, data_path=path, cache_dir=cache,
                               split=None)  # fmt: skip
    kw = dict(width=ds.width, height=ds.height, seq_len=2, d_model=16, num_heads=2, num_layers=1,
              dim_feedforward=16, dropout=0.0, recursion_depth=1, sh_degree=4)  # fmt: skip
    by_range = RecursiveAttentionTransformer(**kw, patch_size=1, lon_range=lon, lat_range=lat)
    by_area = RecursiveAttentionTransformer(**kw, patch_size=1, area=Area("a", lon=list(lon), lat=list(lat)))
    lats, lons = by_range.cell_centres()
    torch.testing.assert_close(lons, torch.from_numpy(ds.lons).double(), rtol=0, atol=1e-9)
    torch.testing.assert_close(lats, torch.from_numpy(ds.lats).double(), rtol=0, atol=1e-9)
    lat_g, lon_g = torch.meshgrid(torch.from_numpy(ds.lats), torch.from_numpy(ds.lons), indexing="ij")
    expect = real_spherical_harmonics(lat_g.reshape(-1), lon_g.reshape(-1), 4)
    torch.testing.assert_close(by_range.sh_features, expect)
    torch.testing.assert_close(by_area.sh_features, expect)
    x, _ = ds[0]
    assert by_area(x[None]).shape == (1, ds.height, ds.width)


def test_nino34_model_builds_with_a_70_degree_width_and_patches_across_the_dateline() -> None:
    from datasets.area import NINO34

    m = tiny(width=70, height=10, patch_size=2, lat_range=None, area=NINO34)
    assert m.lon_range == (170.0, -120.0) and m.lon_width == 70.0
    # patch 5 spans cells 10-11, centred 11 degrees east of 170E -> 181E = -179 (across the dateline)
    lat = torch.tensor([-4.0]).repeat(35)
    lon = (170.0 + 1.0 + 2.0 * torch.arange(35, dtype=torch.float64) + 180.0) % 360.0 - 180.0
    assert lon[5] == -179.0
    torch.testing.assert_close(m.sh_features[:35], real_spherical_harmonics(lat, lon, 3))


def test_area_and_range_errors() -> None:
    from datasets.area import NINO34

    with pytest.raises(ValueError, match="zero width"):
        tiny(lon_range=(30.0, 30.0))
    with pytest.raises(ValueError, match=r"outside \[-180, 360\]"):
        tiny(lon_range=(-200.0, 10.0))
    with pytest.raises(ValueError, match="contradicts area"):
        tiny(area=NINO34, lat_range=None, lon_range=(-180.0, 180.0))
    with pytest.raises(TypeError, match=r"has no \.lon/\.lat"):
        tiny(area="Nino3.4", lat_range=None)
    assert tiny(area=NINO34, lon_range=(170, -120), lat_range=(-5, 5)).lon_width == 70.0


# ------------------------------------------------------------------ gradient checkpointing
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gradient_checkpointing_gives_the_same_results(dropout: float) -> None:
    x = torch.randn(3, 1, 12, 24, generator=torch.Generator().manual_seed(0))
    y = torch.randn(3, 12, 24, generator=torch.Generator().manual_seed(1))
    out = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        m = tiny(dropout=dropout, use_gradient_checkpointing=ckpt)
        torch.manual_seed(1)  # same dropout masks in both runs
        loss = m.loss(m(x), y)
        loss.backward()
        out[ckpt] = (loss.detach(), [p.grad.clone() for p in m.parameters()])
    torch.testing.assert_close(out[True][0], out[False][0])
    for a, b in zip(out[True][1], out[False][1], strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="use_gradient_checkpointing"):
        tiny(use_gradient_checkpointing="yes")


def test_gradient_checkpointing_saves_fewer_activations() -> None:
    def saved_bytes(ckpt: bool) -> int:
        torch.manual_seed(0)
        m = tiny(use_gradient_checkpointing=ckpt)
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = m.loss(m(torch.randn(4, 1, 12, 24)), torch.randn(4, 12, 24))
        loss.backward()
        return sum(seen.values())

    plain, ckpt = saved_bytes(False), saved_bytes(True)
    assert ckpt < plain / 2, (plain, ckpt)
    m = tiny(use_gradient_checkpointing=True).eval()  # eval / no_grad: no checkpoint wrapper at all
    with torch.no_grad():
        m(torch.randn(1, 1, 12, 24))


def _calendar_batch(months: torch.Tensor, h: int = 8, w: int = 8, fields: int = 2) -> torch.Tensor:
    """Inputs that are all zero except the two calendar channels of each target month (0..11)."""
    ang = 2 * torch.pi * months.float() / 12
    cal = torch.stack([ang.cos(), ang.sin()], 1)[:, :, None, None].expand(-1, -1, h, w)
    return torch.cat([torch.zeros(len(months), fields, h, w), cal], 1)


@pytest.mark.usefixtures("one_thread")
def test_calendar_input_learns_a_purely_seasonal_signal():
    torch.manual_seed(0)
    months = torch.arange(12)
    truth = torch.cos(2 * torch.pi * months / 12)[:, None, None].expand(-1, 8, 8)  # the season, nothing else
    kw = dict(width=8, height=8, seq_len=3, d_model=16, num_heads=2, num_layers=1, dim_feedforward=32,
              recursion_depth=1, patch_size=4, residual=False, lead=2)  # fmt: skip
    with_cal, without = tiny(calendar=True, **kw), tiny(**kw)
    x_cal = _calendar_batch(months)
    for model, x in ((with_cal, x_cal), (without, x_cal[:, :2])):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(100):
            opt.zero_grad()
            model.loss(model(x), truth).backward()
            opt.step()
    with torch.no_grad():
        err_cal = (with_cal(x_cal) - truth).square().mean()
        flat = without(x_cal[:, :2])
    # without the calendar the inputs are identical, so is every month's forecast: the season is out of reach
    assert torch.allclose(flat, flat[:1].expand_as(flat), atol=1e-5)
    assert err_cal < 0.1 * truth.square().mean() < (flat - truth).square().mean()
    with pytest.raises(ValueError, match="calendar channels"):
        with_cal(x_cal[:, :2])


def test_calendar_features_place_every_input_month():
    m = tiny(calendar=True, width=8, height=8, seq_len=4, patch_size=4, lead=3)
    feats = m.calendar_features(_calendar_batch(torch.tensor([5]), fields=3)[:, 3:, 0, 0])  # target: June
    phases = torch.atan2(feats[0, 4:8], feats[0, :4])  # sin over cos of the 3 input months + the target
    months = torch.remainder(torch.round(phases * 12 / (2 * torch.pi)), 12)
    assert months.tolist() == [0.0, 1.0, 2.0, 5.0]  # January..March feed a June target at lead 3

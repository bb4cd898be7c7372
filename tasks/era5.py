"""The main job: monthly SST forecasting on ERA5 (dataset + RecursiveAttentionTransformer + scores).

The loop in `trainer/` does the rest. What the model predicts: the normalised anomaly of the month `offset + 1`
months after the last of its `seq_len - 1` input months, as a learned correction on top of a fixed statistical
forecast (`prior`: by default the blend of the area's "LIM + damped residual" hybrid with the same hybrid fitted on
a wider region, or the area's hybrid where the data do not reach that region; validation switches to another of
them only on a clear month-by-month gain, the rolling hindcast's rule, `utils.baselines.choose_on_validation`),
averaged over an `ensemble` of independently initialised members. The network sees
the calendar month of the target and of every input month (`calendar`). At each validation the correction is
scaled by the factor in 0, 0.1, .., 1 whose gain over the prior is clearly positive month by month
(`choose_correction_scale`; 0 = the prior alone), and that factor is part of the weights best.pt keeps: where
validation does not show that the network helps, the forecast is the prior.
Every score is printed beside the statistical baselines (`utils.baselines`), fitted on the training months only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.ratransformer import RecursiveAttentionTransformer, masked_mse
from tasks.args import check_task_args, input_path_problem
from trainer import Task

# The full-size configuration (--preset full) and the reduced CPU preset of the demo.
SEED_PRESET = {
    "resolution": 2.0,
    "d_model": 512,
    "num_heads": 8,
    "num_layers": 3,
    "dim_feedforward": 1024,
    "recursion_depth": 2,
    "dropout": 0.1,
    "seq_len": 2,  # one input month
}
# Sized for monthly data (a few hundred training months): one layer applied twice, d_model 64.
CPU_PRESET = {
    "resolution": 5.0,
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 1,
    "dim_feedforward": 128,
    "recursion_depth": 2,
    "dropout": 0.0,
    "seq_len": 7,  # six months of context
}
PRIORS = ("none", "persistence", "damped_persistence", "lim", "hybrid", "wide_hybrid", "blend")
# Priors that need the wide region (utils.baselines.wide_region), which x's months lack: the task computes them
# for every sample at build and the dataset carries them as x's last channel (set_prior_plane).
WIDE_PRIORS = ("wide_hybrid", "blend")
# prior -> the baseline whose forecast it is (the scores' name)
PRIOR_BASELINE = {
    "persistence": "anomaly_persistence",
    "damped_persistence": "damped_persistence",
    "lim": "lim",
    "hybrid": "hybrid",
    "wide_hybrid": "wide_hybrid",
    "blend": "blend",
}
SHRINK_GRID = tuple(k / 10 for k in range(11))  # correction scales validation chooses from
PRIOR_CHOICES = ("auto", *PRIORS)

# One line per build_era5_task parameter (the CLI turns them into --flags; defaults come from the signature).
ARGS_HELP: dict[str, str] = {
    "data_path": "netCDF file, directory, glob or list; none = $ERA5_DATA_PATH, else the built-in synthetic sample",
    "variable": "netCDF variable to read (sst finds any well-known SST name)",
    "lon": "area longitudes W E; may cross the dateline, e.g. 170 -120",
    "lat": "area latitudes S N",
    "resolution": "grid in degrees (area-mean coarsening of the source data)",
    "seq_len": "months per sample: seq_len-1 input months of context + 1 target",
    "offset": "extra months between the last input month and the target: lead = offset + 1 months",
    "split_ratio": "train/val/test fractions of the samples, in time order",
    "d_model": "transformer width",
    "num_heads": "attention heads",
    "num_layers": "transformer layers in the stack (reused recursion_depth times)",
    "dim_feedforward": "feed-forward width",
    "dropout": "dropout probability",
    "recursion_depth": "times the layer stack is applied (shared weights)",
    "patch_size": "grid cells per token side; none = the model's (4), or 2 on grids under 24 rows",
    "learning_rate": "model's own learning rate (wins over --lr); none = --lr",
    "device_cache": "hold the split on the device: true, false or none (auto, when it fits)",
    "seed": "seed of the model's initial weights",
    "cache_dir": "cache directory for coarse arrays and the sample file; none = $PLAINLOOP_CACHE or ~/.cache/plainloop",
    "prior": "fixed forecast the network corrects: none (zero), persistence (last month's anomaly), "
    "damped_persistence, lim (linear inverse model), hybrid (LIM + damped persistence of the part the "
    "LIM's EOFs leave out), wide_hybrid (the hybrid fitted on every longitude and the area's latitudes widened "
    "to at least 30S-30N, read on the area), blend (the mean of hybrid and wide_hybrid), or auto (blend, else hybrid without the "
    "wide region; another of blend/hybrid/wide_hybrid only if clearly better on validation); all fitted on the "
    "training months",
    "ensemble": "independently initialised members trained side by side; the forecast is their mean",
    "lim_variance": "fraction of the training anomalies' variance the LIM's EOFs keep (prior and baseline)",
    "lim_max_modes": "at most this many EOFs in the LIM (prior and baseline)",
    "calendar": "give the network the calendar month of the target and of every input month",
}
# Each parameter's rule (the knob keywords of trainer/config.py), checked by trainer.config.check_value for the
# CLI, config files and build_era5_task alike (tasks/args.py); lon/lat ranges are checked with the area.
ARGS_RULES: dict[str, dict[str, Any]] = {
    "data_path": {"check": input_path_problem},
    "resolution": {"gt": 0, "max": 90},
    "seq_len": {"min": 2, "max": 1200},
    "offset": {"min": 0, "max": 1200},
    "split_ratio": {"min": 0, "max": 1},
    "d_model": {"min": 1, "max": 65536},
    "num_heads": {"min": 1, "max": 1024},
    "num_layers": {"min": 1, "max": 1024},
    "dim_feedforward": {"min": 1, "max": 2**20},
    "dropout": {"min": 0, "max": 0.99},
    "recursion_depth": {"min": 1, "max": 1024},
    "patch_size": {"min": 1, "max": 1024},
    "learning_rate": {"gt": 0},
    "seed": {"min": 0, "max": 2**32 - 1},
    "ensemble": {"min": 1, "max": 1024},
    "lim_variance": {"gt": 0, "max": 1},
    "lim_max_modes": {"min": 1, "max": 10**5},
}


def _say(msg: str) -> None:
    """A set-up line, once per job: under torchrun every rank builds the task, rank 0 speaks."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[plainloop] {msg}", flush=True)


def era5_train_defaults(on_gpu: bool, using_sample: bool, n_train: int) -> dict[str, Any]:
    """TrainConfig overrides for settings the user did not give, chosen for how much data there is.

    Monthly SST is small data: 30 years are ~300 training samples, so the engine's batch 150 would give two
    optimizer steps per epoch. A batch of about a tenth of the training set (8..150) gives ~10 steps per epoch;
    validation every epoch is cheap at this size and lets the best epoch (by validation loss) be the one that
    is tested, with early stopping once it has not improved for a while. `on_gpu` and `using_sample` only cap
    the work: the CPU demo on the built-in sample must finish in about a minute."""
    from trainer import TrainConfig

    batch = int(min(150, max(8, round(n_train / 10 / 8) * 8)))
    out: dict[str, Any] = {
        "batch_size": batch,
        "epochs": 40 if (using_sample and not on_gpu) else 100,
        "validation_interval": 1,
        "weight_decay": 0.05,
        "early_stopping_patience": 15,
        "test_with_best": True,
    }
    known = {f.name for f in dataclasses.fields(TrainConfig)}  # the engine may not have every knob yet
    return {k: v for k, v in out.items() if k in known}


class PriorForecaster(nn.Module):
    """Network(s) predicting a correction to a fixed linear forecast of the last input month.

    prior(x) = z_last (persistence), r * z_last (damped persistence), the LIM propagated `lead` months
    (z_last -> EOF coefficients -> G(1)^lead -> grid), or the hybrid: the LIM plus r_res * (z_last minus its
    EOF reconstruction); all in normalised anomaly units (linear maps commute with the dataset's one global
    scale). Members start with a zero output head, so the untrained model is the prior. In training mode the
    forward returns every member's forecast (E, B, H, W) and the loss is the mean of the members' losses
    (independent members, as if trained one by one); in eval mode it returns prior + `correction_scale` x the
    members' mean correction, the scale (a buffer, saved with the weights) being set on validation by the task.
    `fields`: how many of x's channels are months (calendar channels follow them). The wide-region priors
    (WIDE_PRIORS) are precomputed per sample and arrive as x's last channel, which the members do not see."""

    # buffers (register_buffer), declared so that they type as tensors; each prior registers only its own
    correction_scale: torch.Tensor
    damping: torch.Tensor
    lim_encode: torch.Tensor
    lim_decode: torch.Tensor
    lim_recon: torch.Tensor
    residual_damping: torch.Tensor
    residual_neighbours: torch.Tensor
    ocean: torch.Tensor

    def __init__(
        self,
        members: Sequence[RecursiveAttentionTransformer],
        prior: str,
        prior_tensors: dict[str, torch.Tensor],
        fields: int,
    ) -> None:
        super().__init__()
        if prior not in PRIORS:
            raise ValueError(f"prior={prior!r}: use one of {PRIORS}")
        self.members = nn.ModuleList(members)
        self.prior = prior
        self.fields = int(fields)
        self.plane = prior in WIDE_PRIORS  # the prior is x's last channel
        for k, v in prior_tensors.items():
            self.register_buffer(k, v.float())
        self.register_buffer("correction_scale", torch.ones(()))
        self.learning_rate = getattr(members[0], "learning_rate", None)

    def nets(self) -> list[RecursiveAttentionTransformer]:
        """The members with their type (nn.ModuleList yields plain modules; __init__ takes only these)."""
        return cast("list[RecursiveAttentionTransformer]", list(self.members))

    def _members_input(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :-1] if self.plane else x

    def prior_forecast(self, x: torch.Tensor) -> torch.Tensor:
        if self.plane:
            return x[:, -1].float()
        z = x[:, self.fields - 1].float()
        if self.prior == "none":
            return torch.zeros_like(z)
        if self.prior == "persistence":
            return z
        if self.prior == "damped_persistence":
            return z * self.damping
        B, H, W = z.shape
        flat = z.reshape(B, H * W)
        coeff = flat @ self.lim_encode
        out = (coeff @ self.lim_decode).reshape(B, H, W)
        if self.prior == "hybrid":
            res = (flat - coeff @ self.lim_recon).reshape(B, H, W)
            out = out + res * self.residual_damping
            if hasattr(self, "residual_neighbours"):  # the 3 x 3 neighbourhood term, land and edges as 0
                hood = F.unfold((res * self.ocean)[:, None], 3, padding=1).view(B, 9, H, W)
                out = out + (hood * self.residual_neighbours).sum(1)
        return out

    def _corrections(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's correction, (E, B, H, W); one member's is a view, not a stacked copy."""
        xm = self._members_input(x)
        outs = [m(xm) for m in self.members]
        return outs[0][None] if len(outs) == 1 else torch.stack(outs)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(prior forecast, the members' mean correction), each (B, H, W)."""
        corr = self._corrections(x)
        return self.prior_forecast(x), corr[0] if len(corr) == 1 else corr.mean(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            base, corr = self.parts(x)
            return base + self.correction_scale * corr
        return self._corrections(x) + self.prior_forecast(x)  # (E, B, H, W)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        m = self.nets()[0]
        if pred.dim() == target.dim() + 1:  # training: every member against the same target
            if pred.shape[1:] != target.shape:
                raise ValueError(f"PriorForecaster.loss: pred {tuple(pred.shape)} is not (members, *target "
                                 f"{tuple(target.shape)})")  # fmt: skip
            # the mean of the members' losses in one pass: each is sum / count over the same valid cells
            loss = masked_mse(pred, target, m.ocean_mask)
            return loss if len(pred) == 1 else loss / len(pred)
        return m.loss(pred, target)

    def set_ocean_mask(self, mask: torch.Tensor) -> None:
        for m in self.nets():
            m.set_ocean_mask(mask)

    def flops_per_sample(self, training: bool = True) -> float:
        return float(sum(m.flops_per_sample(training=training) for m in self.nets()))


def choose_correction_scale(
    base_c: np.ndarray,
    corr_c: np.ndarray,
    truth_c: np.ndarray,
    lats: np.ndarray,
    mask: np.ndarray,
    z: float | None = None,
    lead: int = 1,
) -> float:
    """The scale in SHRINK_GRID for the network's correction that validation supports, else 0 (the prior).

    36-odd validation months choosing among scales (and epochs) would pick noise, and a correction that is
    noise makes the test worse than the prior. So a scale counts only where its month-by-month gain in
    squared error over the prior is clearly positive (`utils.baselines.clear_gain`: mean gain > z standard
    errors, z = Z by default, the rule that chooses the prior); of those, the largest mean gain wins."""
    from utils.baselines import Z, choose_on_validation, per_month_sq_error
    from utils.metrics import lat_weights

    w = lat_weights(lats)
    pm = {a: per_month_sq_error(base_c + a * corr_c, truth_c, w, mask) for a in SHRINK_GRID}
    return float(choose_on_validation(pm, lead, Z if z is None else z)[0])


def _prior_tensors(prior: str, fitted: dict[str, Any], lead: int, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """The fixed linear maps of the prior as tensors (land rows/columns zero)."""
    if prior == "damped_persistence":
        return {"damping": torch.from_numpy(np.nan_to_num(fitted["damped_persistence"].r))}
    if prior not in ("lim", "hybrid"):
        return {}
    lim = fitted["lim"]
    H, W = shape
    flat = np.flatnonzero(lim.mask.reshape(-1))
    enc = np.zeros((H * W, lim.modes))
    enc[flat] = (lim.eofs * lim.sqrt_w).T  # grid -> EOF coefficients
    dec = np.zeros((lim.modes, H * W))
    dec[:, flat] = lim.propagator(lead).T @ (lim.eofs / lim.sqrt_w)  # coefficients -> G^lead -> grid
    out = {"lim_encode": torch.from_numpy(enc), "lim_decode": torch.from_numpy(dec)}
    if prior == "hybrid":
        rec = np.zeros((lim.modes, H * W))
        rec[:, flat] = lim.eofs / lim.sqrt_w  # coefficients -> grid: the EOF reconstruction
        out["lim_recon"] = torch.from_numpy(rec)
        out["residual_damping"] = torch.from_numpy(np.nan_to_num(fitted["hybrid"].residual.r))
        if fitted["hybrid"].neighbours is not None:
            out["residual_neighbours"] = torch.from_numpy(fitted["hybrid"].neighbours.coef).permute(2, 0, 1)
            out["ocean"] = torch.from_numpy(lim.mask.astype(np.float64))
    return out


def load_wide_region(dataset_kw: dict[str, Any], area: Any) -> tuple[Any, Any]:
    """The wide region of an area (`utils.baselines.wide_region`) from the same data: its dataset over every month
    (split None, `dataset_kw` as the area's) and the `WideRegion` that places the area's cells in it. ValueError
    (or OSError) says why the data cannot give it."""
    from datasets.era5 import ERA5SSTMonthlyDataset
    from utils.baselines import WIDE_LAT, WideRegion, wide_region

    wlon, wlat = wide_region((float(dataset_kw["lat"][0]), float(dataset_kw["lat"][1])))
    wds = ERA5SSTMonthlyDataset(
        **{**dataset_kw, "lon": list(wlon), "lat": list(wlat), "split": None, "device_cache": False, "calendar": False}
    )
    if not np.array_equal(wds.months, area.months):
        raise ValueError("its months differ from the area's")
    wmask = wds.ocean_mask.numpy()
    if not np.asarray(wmask.any(axis=1))[np.abs(wds.lats) <= WIDE_LAT].all():
        raise ValueError(f"some latitudes within {WIDE_LAT:g}°S-{WIDE_LAT:g}°N have no data")
    return wds, WideRegion.build(wds._array(), wds.lats, wds.lons, wmask, area.lats, area.lons)


def _wide_prior_anomalies(
    common: dict[str, Any], train: Any, lead: int, lim_kw: dict[str, Any]
) -> tuple[np.ndarray | None, str]:
    """The wide-region hybrid's °C anomaly forecast (N_all, H, W) of every sample's target, all splits in order,
    fitted on the training months only; (None, why) when the data cannot give the wide region ("" when the
    area is its own wide region: the wide hybrid would be the hybrid)."""
    from utils.baselines import HybridLIM, wide_region

    lon, lat = common["lon"], common["lat"]
    wlon, wlat = wide_region((float(lat[0]), float(lat[1])))
    if abs(float(lon[1]) - float(lon[0])) >= 360 and wlat == (min(lat), max(lat)):
        return None, ""
    try:
        wds, region = load_wide_region(common, train)
        hyb = HybridLIM.fit(wds.train_anomalies_c(), wds.lats, lead, region.mask, **lim_kw)
    except (ValueError, OSError) as e:
        return None, (
            f"prior: the data do not give the wide region lon {wlon}, lat {wlat} ({e}); "
            "the wide_hybrid and blend priors are left out (a file reaching 30S-30N at every longitude gives them)"
        )
    last, _ = wds.sample_months()
    return region.area(hyb.predict(wds.anomalies_c()[last])), ""


def _predict_all(
    model: PriorForecaster, ds: Any, device: torch.device, batch_size: int = 64, parts: bool = False
) -> tuple[torch.Tensor, ...]:
    """Normalised predictions, or with `parts` the prior forecast and the correction (`model.parts`), then the
    targets, for every sample of `ds` in order: one forward of the network per batch."""
    outs: list[tuple[torch.Tensor, ...]] = []
    targets = []
    for start in range(0, len(ds), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(ds)))
        x, y = ds.gather(idx)  # served from wherever the split is held
        x = x.to(device, non_blocking=True)
        outs.append(tuple(t.float() for t in (model.parts(x) if parts else (model(x),))))
        targets.append(y.to(device, non_blocking=True))
    return (*(torch.cat(c) for c in zip(*outs)), torch.cat(targets))


def build_era5_task(
    data_path: str | None = None,
    variable: str = "sst",
    lon: tuple[float, float] = (-180, 180),
    lat: tuple[float, float] = (-80, 80),
    resolution: float = 2.0,
    seq_len: int = 7,
    offset: int = 0,
    split_ratio: tuple[float, ...] = (0.8, 0.1, 0.1),
    d_model: int = 512,
    num_heads: int = 8,
    num_layers: int = 3,
    dim_feedforward: int = 1024,
    dropout: float = 0.1,
    recursion_depth: int = 2,
    patch_size: int | None = None,
    learning_rate: float | None = None,
    device_cache: bool | None = None,
    seed: int = 42,
    cache_dir: str | None = None,
    prior: Literal[
        "auto", "none", "persistence", "damped_persistence", "lim", "hybrid", "wide_hybrid", "blend"
    ] = "auto",
    ensemble: int = 1,
    lim_variance: float = 0.9,
    lim_max_modes: int = 20,
    calendar: bool = True,
) -> Task:
    """Monthly SST forecasting: ERA5SSTMonthlyDataset + RecursiveAttentionTransformer + lat-weighted scores."""
    from datasets.era5 import ERA5SSTMonthlyDataset
    from utils.baselines import (
        PRIOR_BASES,
        PRIOR_FALLBACKS,
        baseline_forecasts,
        blend,
        choice_reason,
        choose_on_validation,
        fit_baselines,
        per_month_sq_error,
    )
    from utils.metrics import lat_weights, score_forecasts, weighted_rmse

    check_task_args(build_era5_task, ARGS_RULES, locals())
    common: dict[str, Any] = dict(
        lon=list(lon),
        lat=list(lat),
        seq_len=seq_len,
        offset=offset,
        resolution=resolution,
        data_path=data_path,
        variable=variable,
        split_ratio=tuple(split_ratio),
        device_cache=device_cache,
        cache_dir=cache_dir,
        calendar=bool(calendar),
    )
    train = ERA5SSTMonthlyDataset(split="train", **common)
    val = ERA5SSTMonthlyDataset(split="val", **common)
    test = ERA5SSTMonthlyDataset(split="test", **common)
    lead = int(offset) + 1  # months from the last input month to the target
    mask = train.ocean_mask.numpy()
    fitted = fit_baselines(
        train.train_anomalies_c(), train.lats, mask, lead, variance=lim_variance, max_modes=lim_max_modes
    )
    wide_all, wide_note = _wide_prior_anomalies(
        common, train, lead, {"variance": lim_variance, "max_modes": lim_max_modes}
    )  # fmt: skip
    if wide_note:
        _say(f"note: {wide_note}")
    if prior in WIDE_PRIORS and wide_all is None:
        raise ValueError(
            f"prior={prior!r} needs the wide region (every longitude, latitudes to at least 30S-30N) "
            f"{'from the same data file' if wide_note else 'beyond the area, which already is that region'}: "
            "use prior='hybrid' or 'auto'"
        )

    def wide_anomalies(ds: Any) -> dict[str, np.ndarray]:
        """{wide_hybrid, blend}: °C anomaly forecasts of the split's targets (empty without the wide region)."""
        if wide_all is None:
            return {}
        ref = ds.reference_c()
        w = wide_all[ds.sample_months()[0] - (seq_len - 2)]  # sample i of the split is sample start + i of all
        h = fitted["hybrid"].predict(ref["last_input_c"] - ref["clim_input_c"])
        return {"wide_hybrid": w, "blend": blend(h, w)}

    val_rmse, val_pm = {}, {}
    if len(val):  # the statistical forecasts on the validation months: what prior="auto" chooses by
        ref = val.reference_c()
        fv = baseline_forecasts(fitted, lead, ref["last_input_c"], ref["clim_target_c"], ref["clim_input_c"])
        fv.update({k: ref["clim_target_c"] + a for k, a in wide_anomalies(val).items()})
        val_rmse = {
            p: weighted_rmse(fv[b], ref["truth_c"], val.lats, mask) for p, b in PRIOR_BASELINE.items() if b in fv
        }
        w = lat_weights(val.lats)
        val_pm = {p: per_month_sq_error(fv[b], ref["truth_c"], w, mask) for p, b in PRIOR_BASELINE.items() if b in fv}
    chosen: str = prior  # "auto" becomes the prior it chooses
    why = "asked"
    if prior == "auto":  # the default (the first of PRIOR_BASES there is) unless another is clearly better
        candidates = [
            p
            for p in (*PRIOR_BASES, *PRIOR_FALLBACKS)
            if p in PRIOR_BASELINE and (wide_all is not None or p not in WIDE_PRIORS)
        ]
        if val_pm:
            chosen, gain, se = choose_on_validation({p: val_pm[p] for p in candidates}, lead)
            why = choice_reason(gain, se, candidates[0])
        else:
            chosen, why = candidates[0], "default (no validation months)"
        _say(f"prior: {chosen} ({why})")
    if chosen in WIDE_PRIORS:  # x carries the prior as its last channel, in normalised units
        for ds in (train, val, test):
            if len(ds):
                ds.set_prior_plane(wide_anomalies(ds)[chosen] / ds.anomaly_std)
    if patch_size is None and train.height < 24:
        patch_size = 2  # a small area: 4 x 4 patches would leave a handful of tokens
    torch.manual_seed(seed)  # the model's initial weights follow --seed
    model_kw: dict[str, Any] = dict(
        width=train.width,
        height=train.height,
        seq_len=seq_len,
        d_model=d_model,
        num_heads=num_heads,
        num_layers=num_layers,
        dim_feedforward=dim_feedforward,
        dropout=dropout,
        recursion_depth=recursion_depth,
        learning_rate=learning_rate,
        lon_range=tuple(lon),
        lat_range=tuple(lat),
        calendar=bool(calendar),
        lead=lead,
    )
    if patch_size is not None:
        model_kw["patch_size"] = patch_size
    members = []
    for _ in range(int(ensemble)):
        net = RecursiveAttentionTransformer(**model_kw, residual=False)
        nn.init.zeros_(net.head.weight)  # start exactly at the prior
        net.set_ocean_mask(train.ocean_mask)
        members.append(net)
    prior_t = _prior_tensors(chosen, fitted, lead, (train.height, train.width))
    model = PriorForecaster(members, chosen, prior_t, fields=seq_len - 1)
    artifacts: dict[str, Any] = {}
    refs: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}
    baseline_scores: dict[str, dict[str, dict[str, float]]] = {}  # per split: fixed, so scored once

    def reference(split: str, ds: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if split not in refs:  # fixed for a split: computed once
            ref = ds.reference_c()
            f = baseline_forecasts(fitted, lead, ref["last_input_c"], ref["clim_target_c"], ref["clim_input_c"])
            f.update({k: ref["clim_target_c"] + a for k, a in wide_anomalies(ds).items()})
            refs[split] = (
                ref,
                {k: v for k, v in f.items() if k in ("damped_persistence", "lim", "hybrid", *WIDE_PRIORS)},
            )
        return refs[split]

    def evaluate(m: nn.Module, split: str, device: torch.device) -> dict[str, float]:
        if not isinstance(m, PriorForecaster):  # the engine hands back the task's own model
            raise TypeError(f"the era5 task scores its PriorForecaster, got a {type(m).__name__}")
        ds = val if split == "val" else test
        if len(ds) == 0:
            return {}
        ref, extra = reference(split, ds)
        truth_c = ref["truth_c"]
        shrink = {}
        if split == "val":  # the correction scale validation prefers (0 = the prior)
            base, corr, y = _predict_all(m, ds, device, parts=True)
            losses = torch.stack([m.loss(base + a * corr, y).float() for a in SHRINK_GRID])  # val_loss at each scale
            # note: sync point (evaluation) — the prior, the correction and those losses come to the host in one read
            host = torch.cat([base.reshape(-1), corr.reshape(-1), losses]).cpu()
            base_h, corr_h = host[: base.numel()].view_as(base), host[base.numel() : 2 * base.numel()].view_as(corr)
            base_c = ds.denormalize(base_h, torch.arange(len(ds))).numpy()
            corr_c = corr_h.numpy() * ds.anomaly_std
            a = choose_correction_scale(base_c, corr_c, truth_c, ds.lats, mask, lead=lead)
            m.correction_scale.fill_(a)
            pred_h = base_h + a * corr_h
            shrink = {"val_loss": float(host[2 * base.numel() + SHRINK_GRID.index(a)]), "val_correction_scale": a}
            shrink["val_prior_rmse_c"] = weighted_rmse(base_c, truth_c, ds.lats, mask)
        else:
            pred, y = _predict_all(m, ds, device)
            pred_h = pred.cpu()  # note: sync point (evaluation) — the predictions come to the host once
        pred_c = ds.denormalize(pred_h, torch.arange(len(ds))).numpy()
        scores = score_forecasts(
            pred_c,
            truth_c,
            ref["last_input_c"],
            ref["clim_target_c"],
            ref["clim_input_c"],
            ds.lats,
            mask,
            extra=extra,
            baselines=baseline_scores.get(split),
        )
        baseline_scores[split] = {k: v for k, v in scores.items() if k != "model"}
        out = {f"{split}_rmse_c": scores["model"]["rmse"], f"{split}_acc": scores["model"]["acc"]}
        out.update(shrink)
        for name, s in scores.items():
            if name != "model":
                out[f"{split}_{name}_rmse_c"] = s["rmse"]
                out[f"{split}_{name}_acc"] = s["acc"]
        if split == "test":
            artifacts["scores"] = scores
            k = len(ds) // 2  # one test month for the maps
            ym = int(ds.target_abs_months[k])
            artifacts["test_month"] = {
                "truth_c": truth_c[k],
                "pred_c": pred_c[k],
                "lats": np.asarray(ds.lats),
                "lons": np.asarray(ds.lons),
                "mask": mask,
                "label": np.array(f"test sample {k} (target month {int(ds.target_months[k]) + 1})"),
                "year": np.array(ym // 12),
                "month": np.array(ym % 12 + 1),
                "clim_c": np.asarray(ref["clim_target_c"][k]),  # for the anomaly maps
                "last_input_c": np.asarray(ref["last_input_c"][k]),  # persistence, for the map's title
            }
        return out

    info = {
        "data": train.info,
        "grid": [train.height, train.width],
        "samples": [len(train), len(val), len(test)],
        "lead_months": lead,
        "model": {k: v for k, v in model_kw.items() if k not in ("lon_range", "lat_range")},
        "prior": chosen,
        "prior_choice": why,
        "prior_val_rmse_c": {k: round(v, 5) for k, v in val_rmse.items()},
        "ensemble": int(ensemble),
        "calendar": bool(calendar),
        "lim": {"modes": fitted["lim"].modes, "explained_variance": round(fitted["lim"].explained, 4)},
        "wide_priors": "available" if wide_all is not None else (wide_note or "the area is its own wide region"),
    }
    return Task(
        "era5",
        model,
        train,
        val,
        test,
        evaluate_fn=evaluate,
        lr=learning_rate,  # the task's own rate wins over --lr (the model only stores it)
        monitor_metric="val_loss",
        monitor_mode="min",
        flops_per_sample=model.flops_per_sample(training=True),
        info=info,
        notes=list(getattr(train, "notes", [])),  # e.g. implausible source values masked, with their count
        artifacts=artifacts,
        console_metrics=(
            "val_rmse_c",
            "val_acc",
            "val_loss",
            "val_correction_scale",
        ),  # the baselines' scores go to metrics.jsonl
    )

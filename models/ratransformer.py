"""Recursive-attention transformer for next-month SST on a lat-lon grid.

Shape of the model:
    x (B, T=seq_len-1, H, W)                      previous months, normalised, land = 0
      -> pad H, W up to multiples of patch_size (replicate), cut into p x p patches
      -> Linear(T*p*p -> d_model) per patch       one token per patch
      -> + Linear(SH features -> d_model)          real spherical harmonics at the patch centres (buffer)
      -> (+ Linear(calendar features -> d_model)    calendar=True: the season of every input month and the target)
      -> [num_layers pre-norm blocks] x recursion_depth   the SAME blocks reused (shared weights)
      -> LayerNorm -> Linear(d_model -> p*p)       back to patch pixels, crop the padding
      -> (+ x[:, -1] when residual=True)           predict the change from the last month
    -> (B, H, W)

Under autocast only the blocks' Linear layers and attention run in bf16/fp16: the embedding and the head run in
float32 (small matmuls whose casts would cost more launches than their math), so the residual stream is float32
and LayerNorm, which CUDA's autocast runs in float32, casts nothing on its way in.
Attention goes through `F.scaled_dot_product_attention`, so on a GPU PyTorch picks the Flash or
memory-efficient kernel (bf16/fp16 under autocast) and never materialises the N x N score matrix.
`use_gradient_checkpointing=True` keeps only each layer's input during the forward pass and recomputes
the layer in the backward pass (torch.utils.checkpoint, non-reentrant): less activation memory for about
one more forward pass of compute.
Only torch and the sibling `spherical_harmonics.py` are imported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from models.spherical_harmonics import num_harmonics, real_spherical_harmonics

# patch_size=4 by default: the full-size global 2-degree grid (80 x 180) becomes 20 x 45 = 900 tokens of
# 8 x 8 degrees. That is enough tokens for attention to relate distant basins, small enough that
# attention (O(N^2 d)) stays well below the per-token matmuls' cost at d_model=512 (N=900 < 6*d), and each
# token still sees 16 cells. patch 2 would give 3600 tokens (attention dominates, 4x the FLOPs per layer
# on attention alone); patch 8 gives 10 x 23 (padded) = 230 tokens of 16 degrees, too coarse for SST fronts.
DEFAULT_PATCH_SIZE = 4


class _Block(nn.Module):
    """Pre-norm transformer layer: x + Attn(LN(x)), then x + FFN(LN(x)), GELU in the FFN."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)  # one fused matmul for q, k, v
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, dim_feedforward)
        self.fc2 = nn.Linear(dim_feedforward, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        h = self.num_heads
        # each (B, heads, N, head_dim), a view of qkv (the strides SDPA kernels take); split on the q/k/v axis of
        # (B, N, 3, heads, head_dim) so that the backward stacks the three gradients straight into qkv's layout
        q, k, v = (t.transpose(1, 2) for t in self.qkv(self.norm1(x)).view(B, N, 3, h, D // h).unbind(2))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        a = a.transpose(1, 2).reshape(B, N, D)
        x = x + self.drop(self.proj(a))
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))
        return x


def _full_precision(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast off inside (ops run in their inputs' dtype) where it is on; nothing otherwise."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MSE over the cells where `mask` (H, W) is True and the target (B, H, W) is finite; `pred` is (..., B, H, W),
    each leading index (an ensemble member) scored against the same target: the sum over all of them divided by
    the valid cells of one. Stays on the device: no .item(), no boolean indexing."""
    valid = mask & (target.abs() < math.inf)  # isfinite in two kernels: NaN compares False
    # where() instead of multiply-by-mask so a NaN target (or NaN pred on land) cannot leak in as 0*NaN.
    diff = torch.where(valid, pred.float() - target.float(), 0.0)
    count = valid.sum().clamp_min(1)  # a tensor: no host sync
    return diff.square().sum() / count


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"RecursiveAttentionTransformer: {name} must be an int >= {minimum}, got {value!r} (check model_params)"
        )
    return value


def _pair(name: str, value: object) -> tuple[float, float]:
    try:
        if not isinstance(value, Iterable):
            raise TypeError(name)
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"RecursiveAttentionTransformer: {name} must be a pair of degrees, got {value!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"RecursiveAttentionTransformer: {name}={value!r} must be finite degrees")
    return a, b


def _check_lat(value: object) -> tuple[float, float]:
    south, north = _pair("lat_range", value)
    if not -90.0 <= south < north <= 90.0:
        raise ValueError(
            f"RecursiveAttentionTransformer: lat_range={value!r} must be (south, north) with "
            "-90 <= south < north <= 90 (pass the area bounds, e.g. lat_range=(-80, 80))"
        )
    return south, north


def _check_lon(value: object) -> tuple[float, float, float]:
    """(west, east) in any convention, read eastward as datasets/area.py does -> (west, east, width).

    (-180, 180) and (0, 360) are full circles (width 360); (170, -120) crosses the dateline (width 70).
    """
    west, east = _pair("lon_range", value)
    for edge in (west, east):
        if not -180.0 <= edge <= 360.0:
            raise ValueError(
                f"RecursiveAttentionTransformer: lon_range={value!r}: {edge:g} is outside [-180, 360]; "
                "give (west, east) in degrees east, e.g. (-180, 180), (0, 360) or (170, -120) for Nino 3.4"
            )
    if west == east:
        raise ValueError(
            f"RecursiveAttentionTransformer: lon_range={value!r} has zero width; use (-180, 180) for a full circle"
        )
    span = east - west
    width = 360.0 if span >= 360.0 else (span if span > 0 else span + 360.0)
    return west, east, width


class RecursiveAttentionTransformer(nn.Module):
    """Patch transformer with spherical-harmonic positions and weight-shared recursion.

    Args:
        width, height: grid size W, H (longitude, latitude cells).
        seq_len: months per sample including the target; the model sees seq_len - 1 months.
        d_model, num_heads, num_layers, dim_feedforward, dropout: transformer sizes.
        recursion_depth: how many times the one stack of num_layers blocks is applied (shared weights).
        learning_rate: stored only, for the trainer's optimizer (a model may carry its own rate).
        patch_size: p; each p x p block of cells is one token. H, W need not be multiples of p: the input
            is padded by replicating the last row/column and the output is cropped back.
        lon_range, lat_range: area bounds in degrees, used only for the patch-centre coordinates:
            lon_range = (west, east) read eastward in the dataset's own convention, so (170, -120) is the
            dateline-crossing Nino 3.4 box (170E -> 120W, 70 degrees wide) and (-180, 180) or (0, 360) the
            full circle; lat_range = (south, north). Default: (-180, 180) and (-80, 80), the
            global area. Cell (i, j) is centred at lat_range[0] + (i + 1/2) * cell height and lon_range[0] +
            (j + 1/2) * cell width, wrapped like the dataset's `lons` (to [-180, 180) when both edges are
            <= 180, else [0, 360)): exactly `ERA5SSTMonthlyDataset.lats/lons` when the area's width and
            height are whole multiples of the resolution (every shipped example is). A grid stored the other
            way round (latitude descending) only mirrors the positions: Y_l^m(-lat) = (-1)^(l+m) Y_l^m(lat)
            and a rotation in longitude mixes only the cos/sin pair of each m, so the learned Linear on
            the features absorbs either exactly.
        area: instead of lon_range/lat_range, an object with `.lon = [west, east]` and
            `.lat = [south, north]` (datasets.area.Area), as BaseTrainer and the CLI hand it over.
        sh_degree: highest spherical-harmonic degree L of the positional encoding ((L+1)^2 features).
        residual: predict x[:, -1] + delta instead of the field itself.
        calendar: x carries two more channels after the months, cos and sin of the target month's calendar
            phase (ERA5SSTMonthlyDataset(calendar=True)); the model turns them into cos/sin of the phase of
            every input month (the target's minus `lead` + k months) and the target's first two harmonics,
            and adds a linear embedding of those to every token, so the forecast may depend on the season.
        lead: months from the last input month to the target (only used with calendar=True).
        use_gradient_checkpointing: in training, recompute each transformer layer in the backward pass
            instead of keeping its activations (torch.utils.checkpoint, non-reentrant; dropout masks are
            replayed, so results equal those without it): the remedy for running out of memory.
    """

    # buffers (register_buffer), declared so that they type as tensors
    sh_features: torch.Tensor
    cal_scale: torch.Tensor
    cal_shift: torch.Tensor
    ocean_mask: torch.Tensor

    def __init__(
        self,
        width: int,
        height: int,
        seq_len: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        dim_feedforward: int,
        dropout: float,
        recursion_depth: int,
        learning_rate: float | None = None,
        patch_size: int = DEFAULT_PATCH_SIZE,
        lon_range: tuple[float, float] | None = None,
        lat_range: tuple[float, float] | None = None,
        sh_degree: int = 8,
        residual: bool = True,
        area: Any = None,
        use_gradient_checkpointing: bool = False,
        calendar: bool = False,
        lead: int = 1,
        **unknown: object,
    ) -> None:
        if unknown:
            valid = (
                "width, height, seq_len, d_model, num_heads, num_layers, dim_feedforward, dropout, "
                "recursion_depth, learning_rate, patch_size, lon_range, lat_range, sh_degree, residual, "
                "area, use_gradient_checkpointing, calendar, lead"
            )
            raise TypeError(
                f"RecursiveAttentionTransformer got unknown argument(s) {sorted(unknown)}; "
                f"remove them from model_params (accepted: {valid})"
            )
        super().__init__()
        self.width = _check_int("width", width, 1)
        self.height = _check_int("height", height, 1)
        self.seq_len = _check_int("seq_len", seq_len, 2)
        self.d_model = _check_int("d_model", d_model, 1)
        self.num_heads = _check_int("num_heads", num_heads, 1)
        self.num_layers = _check_int("num_layers", num_layers, 1)
        self.dim_feedforward = _check_int("dim_feedforward", dim_feedforward, 1)
        self.recursion_depth = _check_int("recursion_depth", recursion_depth, 1)
        self.patch_size = _check_int("patch_size", patch_size, 1)
        self.sh_degree = _check_int("sh_degree", sh_degree, 0)
        self.lead = _check_int("lead", lead, 1)
        if not isinstance(calendar, bool):
            raise ValueError(f"RecursiveAttentionTransformer: calendar must be True or False, got {calendar!r}")
        self.calendar = calendar
        if d_model % num_heads:
            raise ValueError(
                f"RecursiveAttentionTransformer: d_model={d_model} is not divisible by num_heads={num_heads}; "
                "pick d_model as a multiple of num_heads (e.g. 512 with 8 heads)"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"RecursiveAttentionTransformer: dropout must be in [0, 1), got {dropout!r}")
        if learning_rate is not None and (
            isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or learning_rate <= 0
        ):
            raise ValueError(
                f"RecursiveAttentionTransformer: learning_rate must be a positive number or None, got {learning_rate!r}"
            )
        self.dropout = float(dropout)
        self.learning_rate = learning_rate
        self.residual = bool(residual)
        if not isinstance(use_gradient_checkpointing, bool):
            raise ValueError(
                "RecursiveAttentionTransformer: use_gradient_checkpointing must be True or False, "
                f"got {use_gradient_checkpointing!r}"
            )
        self.use_gradient_checkpointing = use_gradient_checkpointing
        lon_range, lat_range = self._resolve_area(area, lon_range, lat_range)
        west, east, self.lon_width = _check_lon(lon_range)
        self.lon_range = (west, east)
        self.lat_range = _check_lat(lat_range)

        p = self.patch_size
        self.in_channels = self.seq_len - 1
        self.grid_h = math.ceil(self.height / p)  # patch rows (after padding)
        self.grid_w = math.ceil(self.width / p)
        self.num_tokens = self.grid_h * self.grid_w

        self.patch_embed = nn.Linear(self.in_channels * p * p, self.d_model)
        self.register_buffer("sh_features", self._patch_centre_harmonics(), persistent=False)
        self.pos_proj = nn.Linear(num_harmonics(self.sh_degree), self.d_model, bias=False)
        if self.calendar:  # cos/sin of each input month and the target, + the target's second harmonic
            self.cal_proj = nn.Linear(2 * (self.in_channels + 1) + 2, self.d_model)
            # months before the target of each input month (oldest first): lead + in_channels - 1 .. lead
            back = self.lead + torch.arange(self.in_channels - 1, -1, -1, dtype=torch.float32)
            # phases = target * scale + shift: every input month's (target - 2 pi back / 12), the target's, twice it
            self.register_buffer("cal_scale", torch.tensor([1.0] * (self.in_channels + 1) + [2.0]), persistent=False)
            shift = torch.cat([-(2 * math.pi * back / 12.0), torch.zeros(2)])
            self.register_buffer("cal_shift", shift, persistent=False)
        self.emb_drop = nn.Dropout(self.dropout)
        # One stack, reused recursion_depth times: the parameter count does not depend on the depth.
        self.layers = nn.ModuleList(
            _Block(self.d_model, self.num_heads, self.dim_feedforward, self.dropout) for _ in range(self.num_layers)
        )
        self.norm = nn.LayerNorm(self.d_model)
        self.head = nn.Linear(self.d_model, p * p)
        # Every cell counts until set_ocean_mask is called. Persistent, so a checkpoint keeps the mask.
        self.register_buffer("ocean_mask", torch.ones(self.height, self.width, dtype=torch.bool))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-style small init: with the residual head the untrained model starts close to persistence.
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @staticmethod
    def _resolve_area(area: Any, lon_range: Any, lat_range: Any) -> tuple[Any, Any]:
        if area is None:
            return (
                (-180.0, 180.0) if lon_range is None else lon_range,
                (-80.0, 80.0) if lat_range is None else lat_range,
            )
        if not (hasattr(area, "lon") and hasattr(area, "lat")):
            raise TypeError(
                f"RecursiveAttentionTransformer: area={area!r} has no .lon/.lat; pass a datasets.area.Area "
                "(or lon_range=(west, east), lat_range=(south, north))"
            )
        for name, given, own in (("lon_range", lon_range, area.lon), ("lat_range", lat_range, area.lat)):
            if given is not None and [float(v) for v in given] != [float(v) for v in own]:
                raise ValueError(
                    f"RecursiveAttentionTransformer: {name}={tuple(given)} contradicts area {name[:3]}="
                    f"{list(own)}; pass one of them"
                )
        return tuple(area.lon), tuple(area.lat)

    def cell_centres(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lats (H,), lons (W,)) of the grid cells in degrees (float64), in the dataset's convention."""
        return self._centres(1)

    def _centres(self, cells: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(lats, lons) in degrees (float64) of the centres of `cells` x `cells` blocks of grid cells, the last
        ones reaching into the padding: block i spans cells i*cells .. i*cells+cells-1, its middle is at
        (i*cells + cells/2) cells. Longitudes go eastward (across the dateline if the area crosses it)."""
        dlat = (self.lat_range[1] - self.lat_range[0]) / self.height  # cell size in degrees
        dlon = self.lon_width / self.width
        steps_h = torch.arange(math.ceil(self.height / cells), dtype=torch.float64) * cells + cells / 2
        steps_w = torch.arange(math.ceil(self.width / cells), dtype=torch.float64) * cells + cells / 2
        return self.lat_range[0] + steps_h * dlat, self._wrap_lon(self.lon_range[0] + steps_w * dlon)

    def _wrap_lon(self, lon: torch.Tensor) -> torch.Tensor:
        # the same wrap as datasets/era5_grid.py make_plan: the area's own convention
        if max(self.lon_range) <= 180.0:
            return torch.remainder(lon + 180.0, 360.0) - 180.0
        return torch.remainder(lon, 360.0)

    def _patch_centre_harmonics(self) -> torch.Tensor:
        """(num_tokens, (L+1)^2) real Y_l^m at the patch centres, row-major over the patch grid."""
        lat_c, lon_c = self._centres(self.patch_size)
        # patches that reach into the padding get a centre past the area edge: clamp latitude onto the sphere
        lat_g, lon_g = torch.meshgrid(lat_c.clamp(-90, 90), lon_c, indexing="ij")
        return real_spherical_harmonics(lat_g.reshape(-1), lon_g.reshape(-1), self.sh_degree, torch.float32)

    def set_ocean_mask(self, mask: torch.Tensor) -> None:
        """Cells that count in the loss: a bool (H, W) tensor, True = ocean."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"set_ocean_mask: expected a torch.BoolTensor of shape ({self.height}, {self.width}), "
                f"got {type(mask).__name__}{'' if not isinstance(mask, torch.Tensor) else ' ' + str(mask.dtype)}"
                " (use e.g. torch.isfinite(sst[0]) or mask.bool())"
            )
        if tuple(mask.shape) != (self.height, self.width):
            raise ValueError(
                f"set_ocean_mask: mask shape {tuple(mask.shape)} does not match the model grid "
                f"(height={self.height}, width={self.width})"
            )
        self.ocean_mask.copy_(mask.to(self.ocean_mask.device))

    def calendar_features(self, cal: torch.Tensor) -> torch.Tensor:
        """(B, 2) cos/sin of the target's phase -> (B, 2 * (in_channels + 1) + 2) calendar features: cos of the
        phase of every input month and the target, their sin, then cos and sin of twice the target's phase."""
        target = torch.atan2(cal[:, 1:2].float(), cal[:, 0:1].float())  # (B, 1)
        # one kernel for all T + 2 phases (x * 1 - a and x * 2 + 0 are exact: the values of x - a and 2x)
        phases = torch.addcmul(self.cal_shift, target, self.cal_scale)
        c, s, n = phases.cos(), phases.sin(), self.in_channels + 1
        return torch.cat([c[:, :n], s[:, :n], c[:, n:], s[:, n:]], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, seq_len-1, H, W) -> next month (B, H, W); with calendar=True, (B, seq_len+1, H, W)."""
        extra = 2 if self.calendar else 0
        if x.dim() != 4 or x.shape[1] != self.in_channels + extra or x.shape[2:] != (self.height, self.width):
            raise ValueError(
                f"RecursiveAttentionTransformer: expected input (B, {self.in_channels + extra}, {self.height}, "
                f"{self.width}) = (batch, seq_len-1{' + 2 calendar channels' if extra else ''}, height, width), "
                f"got {tuple(x.shape)}"
            )
        cal = x[:, self.in_channels :, 0, 0] if self.calendar else None
        x = x[:, : self.in_channels] if self.calendar else x
        B, C, H, W = x.shape
        p, gh, gw = self.patch_size, self.grid_h, self.grid_w
        pad_h, pad_w = gh * p - H, gw * p - W
        xp = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate") if (pad_h or pad_w) else x
        # (B, C, gh, p, gw, p) -> (B, gh, gw, C, p, p) -> (B, N, C*p*p)
        tokens = xp.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)
        # embedding and head in the weights' dtype even under autocast (see the module docstring): h stays float32
        with _full_precision(x.device.type):
            h = self.patch_embed(tokens) + self.pos_proj(self.sh_features)
            if cal is not None:
                h = h + self.cal_proj(self.calendar_features(cal))[:, None, :]
        h = self.emb_drop(h)
        ckpt = self.use_gradient_checkpointing and self.training and torch.is_grad_enabled()
        for _ in range(self.recursion_depth):
            for layer in self.layers:
                # non-reentrant: works with torch.compile and DDP, and replays the dropout RNG state
                h = checkpoint(layer, h, use_reentrant=False) if ckpt else layer(h)
        with _full_precision(x.device.type):
            out = self.head(self.norm(h))  # (B, N, p*p)
        out = out.reshape(B, gh, gw, p, p).permute(0, 1, 3, 2, 4).reshape(B, gh * p, gw * p)
        out = out[:, :H, :W]
        if self.residual:
            out = out + x[:, -1]
        return out

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """MSE over ocean cells with a finite target. Stays on the device: no .item(), no boolean indexing."""
        if pred.shape != target.shape or pred.shape[-2:] != (self.height, self.width):
            raise ValueError(
                f"RecursiveAttentionTransformer.loss: pred {tuple(pred.shape)} and target "
                f"{tuple(target.shape)} must both be (B, {self.height}, {self.width})"
            )
        return masked_mse(pred, target, self.ocean_mask)

    def flops_per_sample(self, training: bool = True) -> float:
        """Analytic matmul FLOPs per sample (2 per multiply-add); training = forward x 3 (backward ~ 2x)."""
        N, D, F_, p = self.num_tokens, self.d_model, self.dim_feedforward, self.patch_size
        embed = 2 * N * (self.in_channels * p * p) * D
        per_layer = (
            2 * N * D * 3 * D  # qkv
            + 2 * 2 * N * N * D  # q @ k^T and attn @ v over all heads
            + 2 * N * D * D  # output projection
            + 2 * 2 * N * D * F_  # fc1 + fc2
        )
        head = 2 * N * D * p * p
        # The positional projection (N x (L+1)^2 x D) is shared by the whole batch: not a per-sample cost.
        fwd = embed + per_layer * self.num_layers * self.recursion_depth + head
        return float(3 * fwd if training else fwd)


def _memory_probe(argv: list[str] | None = None) -> None:
    """`python -m models.ratransformer [--batch 4]`: activation memory of one training step of the full-size
    configuration with and without gradient checkpointing, each in a fresh process (peak RSS is per process)."""
    import argparse
    import json
    import resource
    import subprocess
    import sys

    ap = argparse.ArgumentParser(description=_memory_probe.__doc__)
    ap.add_argument("--batch", type=int, default=4, help="samples per step (default: 4)")
    ap.add_argument("--checkpointing", choices=("on", "off"), help="measure one setting in this process")
    args = ap.parse_args(argv)
    if args.checkpointing is None:
        rows = {}
        for mode in ("off", "on"):
            cmd = [
                sys.executable,
                "-m",
                "models.ratransformer",
                "--batch",
                str(args.batch),
                "--checkpointing",
                mode,
            ]
            rows[mode] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(json.dumps(rows, indent=2))
        off, on = rows["off"], rows["on"]
        print(
            f"saved activations: {off['saved_mb']:.0f} MB -> {on['saved_mb']:.0f} MB; peak RSS above the "
            f"no-grad forward: {off['step_peak_mb']:.0f} MB -> {on['step_peak_mb']:.0f} MB; step "
            f"{off['step_s']:.2f} s -> {on['step_s']:.2f} s"
        )
        return
    import time

    def peak_mb() -> float:  # ru_maxrss is KiB on Linux, bytes on macOS
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 2**20 if sys.platform == "darwin" else r / 1024

    torch.manual_seed(0)
    m = RecursiveAttentionTransformer(width=180, height=80, seq_len=2, d_model=512, num_heads=8, num_layers=3,
                                      dim_feedforward=1024, dropout=0.1, recursion_depth=2,
                                      use_gradient_checkpointing=args.checkpointing == "on")  # fmt: skip
    x, y = torch.randn(args.batch, 1, 80, 180), torch.randn(args.batch, 80, 180)
    with torch.no_grad():
        m(x)  # the forward's own temporaries, so the baseline below holds them
    base = peak_mb()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = m.loss(m(x), y)
    loss.backward()
    step_s = time.perf_counter() - t0
    print(json.dumps({"batch": args.batch, "saved_mb": sum(seen.values()) / 2**20, "baseline_peak_mb": base,
                      "peak_mb": peak_mb(), "step_peak_mb": peak_mb() - base, "step_s": step_s,
                      "torch": torch.__version__}))  # fmt: skip


if __name__ == "__main__":
    _memory_probe()

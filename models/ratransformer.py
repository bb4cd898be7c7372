"""Recursive-attention transformer for next-month SST on a lat-lon grid.

Shape of the model (the name and arguments follow the seed guide 000):
    x (B, T=seq_len-1, H, W)                      previous months, normalised, land = 0
      -> pad H, W up to multiples of patch_size (replicate), cut into p x p patches
      -> Linear(T*p*p -> d_model) per patch       one token per patch
      -> + Linear(SH features -> d_model)          real spherical harmonics at the patch centres (buffer)
      -> [num_layers pre-norm blocks] x recursion_depth   the SAME blocks reused (shared weights)
      -> LayerNorm -> Linear(d_model -> p*p)       back to patch pixels, crop the padding
      -> (+ x[:, -1] when residual=True)           predict the change from the last month
    -> (B, H, W)

Attention goes through `F.scaled_dot_product_attention`, so on a GPU PyTorch picks the Flash or
memory-efficient kernel (bf16/fp16 under autocast) and never materialises the N x N score matrix.
Only torch and the sibling `spherical_harmonics.py` are imported.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.spherical_harmonics import num_harmonics, real_spherical_harmonics

# patch_size=4 by default: the seed's global 2-degree grid (80 x 180) becomes 20 x 45 = 900 tokens of
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
        qkv = self.qkv(self.norm1(x)).view(B, N, 3, h, D // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, head_dim): the layout SDPA kernels want
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        a = a.transpose(1, 2).reshape(B, N, D)
        x = x + self.drop(self.proj(a))
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))
        return x


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"RecursiveAttentionTransformer: {name} must be an int >= {minimum}, got {value!r} "
            "(check model_params)"
        )
    return value


def _check_range(name: str, value: object, lo: float, hi: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(
            f"RecursiveAttentionTransformer: {name} must be a pair (min, max) of degrees, got {value!r}"
        ) from None
    if not (lo <= a < b <= hi):
        raise ValueError(
            f"RecursiveAttentionTransformer: {name}={value!r} must satisfy {lo} <= min < max <= {hi} "
            "(pass the area bounds, e.g. lat_range=(-80, 80), lon_range=(-180, 180))"
        )
    return a, b


class RecursiveAttentionTransformer(nn.Module):
    """Patch transformer with spherical-harmonic positions and weight-shared recursion.

    Args:
        width, height: grid size W, H (longitude, latitude cells).
        seq_len: months per sample including the target; the model sees seq_len - 1 months.
        d_model, num_heads, num_layers, dim_feedforward, dropout: transformer sizes.
        recursion_depth: how many times the one stack of num_layers blocks is applied (shared weights).
        learning_rate: stored only, for the trainer's optimizer (seed-guide compatibility).
        patch_size: p; each p x p block of cells is one token. H, W need not be multiples of p: the input
            is padded by replicating the last row/column and the output is cropped back.
        lon_range, lat_range: area bounds in degrees, used only for the patch-centre coordinates.
            Row 0 is taken as lat_range[0] and column 0 as lon_range[0]. A grid stored the other way
            round (latitude descending) only mirrors the positions: Y_l^m(-lat) = (-1)^(l+m) Y_l^m(lat)
            and a rotation in longitude mixes only the cos/sin pair of each m, so the learned Linear on
            the features absorbs either exactly.
        sh_degree: highest spherical-harmonic degree L of the positional encoding ((L+1)^2 features).
        residual: predict x[:, -1] + delta instead of the field itself.
    """

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
        lon_range: tuple[float, float] = (-180.0, 180.0),
        lat_range: tuple[float, float] = (-80.0, 80.0),
        sh_degree: int = 8,
        residual: bool = True,
        **unknown: object,
    ) -> None:
        if unknown:
            valid = (
                "width, height, seq_len, d_model, num_heads, num_layers, dim_feedforward, dropout, "
                "recursion_depth, learning_rate, patch_size, lon_range, lat_range, sh_degree, residual"
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
        if d_model % num_heads:
            raise ValueError(
                f"RecursiveAttentionTransformer: d_model={d_model} is not divisible by num_heads={num_heads}; "
                "pick d_model as a multiple of num_heads (e.g. 512 with 8 heads)"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"RecursiveAttentionTransformer: dropout must be in [0, 1), got {dropout!r}")
        if learning_rate is not None and (
            isinstance(learning_rate, bool)
            or not isinstance(learning_rate, (int, float))
            or learning_rate <= 0
        ):
            raise ValueError(
                f"RecursiveAttentionTransformer: learning_rate must be a positive number or None, "
                f"got {learning_rate!r}"
            )
        self.dropout = float(dropout)
        self.learning_rate = learning_rate
        self.residual = bool(residual)
        self.lon_range = _check_range("lon_range", lon_range, -360.0, 720.0)
        self.lat_range = _check_range("lat_range", lat_range, -90.0, 90.0)

        p = self.patch_size
        self.in_channels = self.seq_len - 1
        self.grid_h = math.ceil(self.height / p)  # patch rows (after padding)
        self.grid_w = math.ceil(self.width / p)
        self.num_tokens = self.grid_h * self.grid_w

        self.patch_embed = nn.Linear(self.in_channels * p * p, self.d_model)
        self.register_buffer("sh_features", self._patch_centre_harmonics(), persistent=False)
        self.pos_proj = nn.Linear(num_harmonics(self.sh_degree), self.d_model, bias=False)
        self.emb_drop = nn.Dropout(self.dropout)
        # One stack, reused recursion_depth times: the parameter count does not depend on the depth.
        self.layers = nn.ModuleList(
            _Block(self.d_model, self.num_heads, self.dim_feedforward, self.dropout)
            for _ in range(self.num_layers)
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

    def _patch_centre_harmonics(self) -> torch.Tensor:
        """(num_tokens, (L+1)^2) real Y_l^m at the patch centres, row-major over the patch grid."""
        p = self.patch_size
        lat0, lat1 = self.lat_range
        lon0, lon1 = self.lon_range
        dlat = (lat1 - lat0) / self.height  # cell size in degrees
        dlon = (lon1 - lon0) / self.width
        # Centre of patch i spans cells i*p .. i*p+p-1, i.e. the middle is at (i*p + p/2) cells. Patches
        # that reach into the padding get a centre past the area edge: clamp latitude onto the sphere.
        lat_c = (lat0 + (torch.arange(self.grid_h, dtype=torch.float64) * p + p / 2) * dlat).clamp(-90, 90)
        lon_c = lon0 + (torch.arange(self.grid_w, dtype=torch.float64) * p + p / 2) * dlon
        lat_g, lon_g = torch.meshgrid(lat_c, lon_c, indexing="ij")
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, seq_len-1, H, W) -> next month (B, H, W)."""
        if x.dim() != 4 or x.shape[1] != self.in_channels or x.shape[2:] != (self.height, self.width):
            raise ValueError(
                f"RecursiveAttentionTransformer: expected input (B, {self.in_channels}, {self.height}, "
                f"{self.width}) = (batch, seq_len-1, height, width), got {tuple(x.shape)}"
            )
        B, C, H, W = x.shape
        p, gh, gw = self.patch_size, self.grid_h, self.grid_w
        pad_h, pad_w = gh * p - H, gw * p - W
        xp = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate") if (pad_h or pad_w) else x
        # (B, C, gh, p, gw, p) -> (B, gh, gw, C, p, p) -> (B, N, C*p*p)
        tokens = xp.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)
        h = self.patch_embed(tokens) + self.pos_proj(self.sh_features)
        h = self.emb_drop(h)
        for _ in range(self.recursion_depth):
            for layer in self.layers:
                h = layer(h)
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
        valid = self.ocean_mask & torch.isfinite(target)  # broadcasts (H, W) over the batch
        # where() instead of multiply-by-mask so a NaN target (or NaN pred on land) cannot leak in as 0*NaN.
        diff = torch.where(valid, pred.float() - target.float(), 0.0)
        count = valid.sum().clamp_min(1)  # a tensor: no host sync
        return diff.square().sum() / count

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

"""A small re-ID network in pure torch (torchvision is not on every machine) and its losses.

    image (B, 3, H, W)
      -> stem conv3x3 -> 4 residual stages (stride 2, 2, 2, 1; widths w, 2w, 4w, 8w)
      -> global average pool -> f (B, 8w)                 "features": what the triplet loss sees
      -> BNNeck: BatchNorm1d, bias frozen -> f_bn         "bn_features": what retrieval uses
      -> Linear(no bias) -> logits (B, num_classes)        identity classifier, training only

The BNNeck (Luo et al., "Bag of Tricks", 2019) lets the triplet loss work in the un-normalised space and
the cross-entropy in the normalised one; retrieval uses the normalised features (cosine distance).
Losses: identity cross-entropy with label smoothing + batch-hard triplet (Hermans et al., 2017). Both
stay on the device (no .item()), so the training step never syncs with the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        return F.relu(self.bn2(self.conv2(y)) + self.short(x), inplace=True)


class ReIDNet(nn.Module):
    """Residual CNN backbone + BNNeck. forward -> dict(features, bn_features, logits)."""

    def __init__(self, num_classes: int, width: int = 32, blocks_per_stage: int = 1, in_channels: int = 3) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(
                f"ReIDNet: num_classes={num_classes}; the identity classifier needs >= 2 training identities"
            )
        if width < 4 or blocks_per_stage < 1:
            raise ValueError(f"ReIDNet: width={width} must be >= 4 and blocks_per_stage={blocks_per_stage} >= 1")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        layers: list[nn.Module] = []
        cin = width
        for i, stride in enumerate((2, 2, 2, 1)):
            cout = width * 2**i
            for b in range(blocks_per_stage):
                layers.append(_ResBlock(cin, cout, stride if b == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*layers)
        self.embed_dim = cin
        self.bnneck = nn.BatchNorm1d(cin)
        self.bnneck.bias.requires_grad_(False)  # BNNeck: no shift, so the classifier sees centred features
        self.classifier = nn.Linear(cin, num_classes, bias=False)
        for mod in self.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
        nn.init.normal_(self.classifier.weight, std=0.001)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.stages(self.stem(x)).mean((2, 3))
        fb = self.bnneck(f)
        out = {"features": f, "bn_features": fb}
        if self.training:
            out["logits"] = self.classifier(fb)
        return out


def batch_hard_triplet_loss(features: torch.Tensor, labels: torch.Tensor, margin: float = 0.3) -> torch.Tensor:
    """Mean over anchors of relu(margin + hardest positive distance - hardest negative distance).

    Euclidean distances; the anchor itself counts as a (distance-0) positive, so a batch with K = 1 still
    gives a finite loss. Anchors without any negative in the batch contribute 0.
    """
    f = features.float()
    sq = (f * f).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * f @ f.t()
    dist = d2.clamp_min(1e-12).sqrt()
    same = labels[:, None] == labels[None, :]
    hardest_pos = dist.masked_fill(~same, 0.0).amax(1)
    hardest_neg = dist.masked_fill(same, float("inf")).amin(1)
    loss = F.relu(margin + hardest_pos - hardest_neg)
    return torch.where(torch.isfinite(hardest_neg), loss, torch.zeros_like(loss)).mean()


class ReIDLoss(nn.Module):
    """ce_weight * CE(logits, labels; label smoothing) + triplet_weight * batch-hard triplet(features)."""

    def __init__(
        self,
        label_smoothing: float = 0.1,
        margin: float = 0.3,
        ce_weight: float = 1.0,
        triplet_weight: float = 1.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
        self.label_smoothing, self.margin = label_smoothing, margin
        self.ce_weight, self.triplet_weight = ce_weight, triplet_weight

    def forward(self, out: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(out["logits"].float(), labels, label_smoothing=self.label_smoothing)
        tri = batch_hard_triplet_loss(out["features"], labels, self.margin)
        return self.ce_weight * ce + self.triplet_weight * tri

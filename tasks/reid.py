"""The cross-modality re-identification task: data, ReIDNet, losses, P x K sampler, retrieval metrics.

    python train_optimized.py --task reid                                   # synthetic set (built in)
    python train_optimized.py --task reid --data_path /data/SYSU-MM01 --reid_format sysu
    python train_optimized.py --task reid --data_path /data/Market-1501 --reid_format market1501

The loop sees only the `Task`: a loss that stays on the device, an evaluation that extracts features in
eval mode and scores the query/gallery protocols, a batch-sampler factory that builds the cached
P x K sampler (datasets/cached_sampler.py) with the loop's batch size, seed and DDP rank, and
`step_metrics` (feature-norm monitoring, read by the loop at NORM_EVERY).

Protocol: validation identities are held out from the training identities and choose best.pt; the test
identities are used only for the final test scores. Metrics are "val_..." and "test_...".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from datasets.cached_sampler import CachedModalAwarePKSampler, parse_epoch_length
from datasets.reid import (
    ImageFileReID,
    ReIDEvalSet,
    SyntheticCrossModalReID,
    read_market1501,
    read_sysu_mm01,
    synthetic_reid,
)
from models.reid_net import ReIDLoss, ReIDNet
from tasks.args import check_task_args, input_path_problem
from trainer import Task
from trainer.signals import ignore_stop_signals
from utils.reid_eval import retrieval_metrics, score_names

logger = logging.getLogger(__name__)

FORMATS = ("synthetic", "market1501", "sysu")

# One entry per build_reid_task parameter: the CLI makes a --flag of each (help text; the default is
# taken from the signature).
ARGS_HELP: dict[str, str] = {
    "data_path": "re-ID dataset root (default: the built-in synthetic set)",
    "reid_format": "synthetic | market1501 | sysu (SYSU-MM01)",
    "num_instances": "K, images per identity in a P x K batch (P = batch_size / K)",
    "image_size": "H W of the network input (default: 48 24 for the synthetic set, 128 64 for image folders)",
    "seed": "seeds the data (synthetic set, held-out identities, SYSU gallery draws) and the model's "
    "initial weights; the loop seeds the rest from the same --seed",
    "num_identities": "training identities of the synthetic set (default: 256)",
    "width": "ReIDNet base width (default: 16 for the synthetic set, 32 for image folders)",
    "label_smoothing": "label smoothing of the identity cross-entropy",
    "ce_weight": "weight of the identity cross-entropy beside the triplet loss (default: 0.3 for the "
    "synthetic set, 1.0 for image folders)",
    "margin": "batch-hard triplet margin",
    "eval_workers": "DataLoader workers for feature extraction at evaluation (image folders)",
    "channel_aug": "probability that a training RGB image is replaced by one of its channels x3 (channel "
    "augmentation for visible-infrared re-ID; 0 = off)",
    "num_passes": "passes over the identities per epoch, instead of --epoch_length (default: none)",
    "epoch_length": "batches per epoch: auto (about one look per sample) | seed (one pass over the identities: "
    "identities / P batches) | N (default: seed for the synthetic set, auto for image folders)",
    "val_fraction": "share of identities held out for validation, which chooses best.pt (default: 0.125 "
    "extra identities for the synthetic set, 0.1 of the training ids for Market-1501, exp/val_id.txt "
    "for SYSU-MM01; 0 = no validation set, for SYSU: train on train + val ids as papers do)",
    "sysu_trials": "SYSU-MM01: random single-shot gallery draws, scored as mean and std (standard: 10)",
}


def _epoch_length_problem(v: str) -> str | None:
    try:
        parse_epoch_length(v)
    except ValueError:
        return "use auto, seed (one pass over the identities) or a whole number of batches >= 1"
    return None


# Each parameter's rule (the knob keywords of trainer/config.py): the CLI, config files and this builder check
# every value with them through trainer.config.check_value, so a bad value is one line naming the flag.
ARGS_RULES: dict[str, dict[str, Any]] = {
    "data_path": {"check": input_path_problem},
    "reid_format": {"choices": FORMATS},
    "num_instances": {"min": 1, "max": 4096},
    "image_size": {"min": 4, "max": 4096},
    "seed": {"min": 0, "max": 2**32 - 1},
    "num_identities": {"min": 2, "max": 10**6},
    "width": {"min": 1, "max": 4096},
    "label_smoothing": {"min": 0, "max": 0.99},
    "ce_weight": {"min": 0, "max": 1e6},
    "margin": {"min": 0, "max": 1e6},
    "eval_workers": {"min": 0, "max": 256},
    "channel_aug": {"min": 0, "max": 1},
    "num_passes": {"min": 1, "max": 10**6},
    "epoch_length": {"check": _epoch_length_problem},
    "val_fraction": {"min": 0, "max": 0.99},
    "sysu_trials": {"min": 1, "max": 10**4},
}


def random_channel_gray(x: torch.Tensor, is_ir: torch.Tensor, p: float) -> torch.Tensor:
    """Channel augmentation for visible-infrared re-ID (as in Ye et al., "Channel Augmented Joint
    Learning", ICCV 2021): with probability p an RGB image becomes one of its channels replicated x3, so
    the network cannot lean on hue, which IR images do not have. Vectorised on the batch's device."""
    b = x.shape[0]
    pick = (torch.rand(b, device=x.device) < p) & (is_ir == 0)
    ch = torch.randint(0, x.shape[1], (b,), device=x.device)
    gray = x[torch.arange(b, device=x.device), ch].unsqueeze(1).expand_as(x)
    return torch.where(pick[:, None, None, None], gray, x)


def extract_features(
    model: nn.Module, dataset: Any, device: torch.device, batch_size: int = 256, num_workers: int = 0
) -> np.ndarray:
    """BNNeck features of every sample of `dataset`, in eval mode, without gradients -> float32 (N, D)."""
    was_training = model.training
    model.eval()
    feats: list[torch.Tensor] = []
    with torch.no_grad():
        if hasattr(dataset, "gather"):  # tensor-backed set: slice it, no DataLoader needed
            n = len(dataset)
            for s in range(0, n, batch_size):
                idx = torch.arange(s, min(s + batch_size, n))
                x = dataset.gather(idx.to(dataset.images.device))["image"].to(device, non_blocking=True)
                feats.append(model(x)["bn_features"].float())
        else:
            for batch in DataLoader(
                dataset,
                batch_size=batch_size,
                shuffle=False,
                num_workers=num_workers,
                worker_init_fn=ignore_stop_signals if num_workers else None,  # a stop is the trainer's
            ):
                feats.append(model(batch["image"].to(device, non_blocking=True))["bn_features"].float())
    model.train(was_training)
    return torch.cat(feats).cpu().numpy()  # one sync, at evaluation


def build_reid_task(
    data_path: str | None = None,
    reid_format: str = "synthetic",
    num_instances: int = 4,
    image_size: tuple[int, int] | None = None,
    seed: int = 42,
    num_identities: int | None = None,
    width: int | None = None,
    label_smoothing: float = 0.1,
    ce_weight: float | None = None,
    margin: float = 0.3,
    eval_workers: int = 0,
    channel_aug: float = 0.0,
    num_passes: int | None = None,
    epoch_length: str | None = None,
    val_fraction: float | None = None,
    sysu_trials: int = 10,
    **unused: Any,
) -> Task:
    """The re-ID Task (ARGS_HELP describes every option).

    channel_aug is off by default because it lowered RGB->IR mAP on the synthetic set (32x16 images,
    1,200 steps of a hand loop: 0.36 without, 0.28 with p=0.5).
    Unknown keyword arguments are ignored (the CLI passes one set of flags to every task).
    """
    check_task_args(build_reid_task, ARGS_RULES, locals())
    if data_path is None and reid_format != "synthetic":
        raise ValueError(f"--reid_format {reid_format} reads image folders: give --data_path (the dataset root)")
    if data_path is not None and reid_format == "synthetic":
        raise ValueError(
            f"--data_path {data_path} given with --reid_format synthetic: add --reid_format market1501 or sysu"
        )
    if data_path is not None and not Path(data_path).is_dir():
        layout = (
            "the SYSU-MM01 folder holding cam1..cam6/ and exp/"
            if reid_format == "sysu"
            else "the extracted Market-1501 folder holding bounding_box_train/, query/ and bounding_box_test/"
        )
        what = "is a file, not a directory" if Path(data_path).exists() else "no such directory"
        raise FileNotFoundError(f"--data_path {data_path}: {what}; give {layout}")
    if epoch_length is not None and num_passes is not None:
        raise ValueError(f"--epoch_length {epoch_length} and --num_passes {num_passes} both set the epoch; "
                         "give one of them")  # fmt: skip
    train: SyntheticCrossModalReID | ImageFileReID
    val: ReIDEvalSet | None
    if reid_format == "synthetic":
        size = tuple(image_size) if image_size else (48, 24)
        n_ids = num_identities or 256
        frac = 0.125 if val_fraction is None else val_fraction
        # many identities with few images each: re-ID generalises to unseen people through the number of
        # identities seen (measured: 128 ids x 8 images overfit within 300 steps, 256 x 8 did not)
        train, val, test = synthetic_reid(
            n_ids,
            samples_per_id=8,
            image_size=size,  # type: ignore[arg-type]
            seed=seed,
            num_val_identities=max(1, int(round(frac * n_ids))) if frac > 0 else 0,  # asked for: at least one
        )
        monitor = "rgb2ir_mAP"
    elif reid_format == "sysu":
        if val_fraction not in (None, 0, 0.0):
            raise ValueError(
                f"--val_fraction {val_fraction} with --reid_format sysu: SYSU-MM01 has its own validation "
                "identities (exp/val_id.txt); leave --val_fraction unset to use them, or 0 to train on them"
            )
        size = tuple(image_size) if image_size else (128, 64)
        train, val, test = read_sysu_mm01(data_path, size, trials=sysu_trials, seed=seed,  # type: ignore[arg-type]
                                          hold_out_val_ids=val_fraction is None)  # fmt: skip
        monitor = "allsearch_mAP"  # the standard SYSU-MM01 figure: IR queries, all-search RGB gallery
    else:
        size = tuple(image_size) if image_size else (128, 64)
        frac = 0.1 if val_fraction is None else val_fraction
        train, val, test = read_market1501(data_path, size, val_fraction=frac, seed=seed)  # type: ignore[arg-type]
        monitor = "mAP"  # single-modality: one query -> gallery protocol

    width = width or (16 if reid_format == "synthetic" else 32)
    torch.manual_seed(seed)  # the initial weights follow --seed (two runs with one seed are identical)
    model = ReIDNet(train.num_classes, width=width)
    if epoch_length is None and num_passes is None:
        epoch_length = "seed" if reid_format == "synthetic" else "auto"
    # the identity cross-entropy is what overfits the synthetic set's 256 identities: at weight 0.3 the
    # RGB->IR mAP on unseen identities after 1,920 steps of a hand loop (AdamW 1e-3, one-cycle) was 0.44
    # against 0.26 at weight 1.0 (same seed and data)
    ce_weight = ce_weight if ce_weight is not None else (0.3 if reid_format == "synthetic" else 1.0)
    criterion = ReIDLoss(label_smoothing=label_smoothing, margin=margin, ce_weight=ce_weight)
    last: dict[str, torch.Tensor] = {}  # the last batch's features, detached, on the device

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["image"]
        if channel_aug > 0:
            x = random_channel_gray(x, batch["is_ir"], channel_aug)
        out = m(x)
        # kept by reference (no copy, no sync); step_metrics turns them into norms only when asked
        last["features"], last["bn_features"] = out["features"].detach(), out["bn_features"].detach()
        return criterion(out, batch["label"])  # on the device, no host sync

    def step_metrics() -> dict[str, torch.Tensor]:
        """Feature monitoring: mean L2 norm of the last batch's features before and after the
        BNNeck, as 0-dim device tensors (the loop reads them back at NORM_EVERY with the grad norm)."""
        if not last:
            return {}
        return {
            "feat_norm": last["features"].float().norm(dim=1).mean(),
            "bn_feat_norm": last["bn_features"].float().norm(dim=1).mean(),
        }

    def evaluate_fn(m: nn.Module, split: str, device: torch.device) -> dict[str, float]:
        ev = val if split == "val" else test
        if ev is None:
            return {}
        ds = ev.dataset
        feats = extract_features(m, ds, device, num_workers=eval_workers)
        return retrieval_metrics(
            feats, ds.pids, ds.camids, ev.protocols, ev.excluded_camera_pairs, ev.ranks, prefix=f"{split}_"
        )

    info: dict[str, Any] = {
        "format": reid_format,
        "data_path": data_path,
        "image_size": list(size),
        "train_samples": len(train),
        "train_identities": int(train.num_classes),
        "val_samples": len(val) if val is not None else 0,
        "val_identities": len(np.unique(val.dataset.pids)) if val is not None else 0,
        "test_samples": len(test),
        "test_identities": len(np.unique(test.dataset.pids)),
        "protocols": {
            k: [len(q), len(g) if isinstance(g, np.ndarray) else f"{len(g)} trials"]
            for k, (q, g) in test.protocols.items()
        },  # fmt: skip
        "num_instances": num_instances,
        "epoch_length": epoch_length,
        "num_passes": num_passes,
        "model": {"name": "ReIDNet", "width": width, "embed_dim": model.embed_dim},
        "loss": {
            "label_smoothing": label_smoothing,
            "triplet_margin": margin,
            "ce_weight": ce_weight,
            "channel_aug": channel_aug,
        },
    }

    # the CLI's "data:" line: where the images came from and how many per split
    def split(ids: int, images: int) -> str:
        return f"{ids} {'identity' if ids == 1 else 'identities'} / {images} image{'' if images == 1 else 's'}"

    source = (
        "the built-in SYNTHETIC cross-modality set (not real data)"
        if reid_format == "synthetic"
        else f"{data_path} ({'SYSU-MM01' if reid_format == 'sysu' else 'Market-1501'} folder)"
    )
    info["data_source"] = (
        f"{source}; train {split(info['train_identities'], info['train_samples'])}, val "
        + (split(info["val_identities"], info["val_samples"]) if val is not None else "none (--val_fraction 0)")
        + f", test {split(info['test_identities'], info['test_samples'])}"
    )

    def batch_sampler_fn(
        dataset: Any,
        batch_size: int,
        seed: int = seed,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
    ) -> CachedModalAwarePKSampler:
        sampler = CachedModalAwarePKSampler(
            dataset,
            batch_size,
            num_instances,
            ensure_rgb=True,
            prefer_complete=True,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            num_passes=num_passes,
            epoch_length=epoch_length if epoch_length is not None else "auto",
        )
        info["sampler"] = sampler.describe()  # printed once by the CLI
        info["sampler_cache"] = sampler.cache_summary
        return sampler

    # the scores on the console line; "<...>_trials" (the number of SYSU gallery draws) stays in metrics.jsonl
    console = score_names(test.protocols, test.ranks, "test_")
    if val is not None:
        console = score_names(val.protocols, val.ranks, "val_") + console
    return Task(
        "reid",
        model,
        train,
        val_set=val,
        test_set=test,
        loss_fn=loss_fn,
        evaluate_fn=evaluate_fn,
        batch_sampler_fn=batch_sampler_fn,
        monitor_metric=f"val_{monitor}",
        console_metrics=console,
        monitor_mode="max",
        step_metrics=step_metrics,
        info=info,
    )

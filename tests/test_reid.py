"""Re-ID datasets, model, losses, metrics and the task, on tiny data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from datasets.cached_sampler import CachedModalAwarePKSampler
from datasets.reid import (
    MEAN,
    STD,
    SYSU_EXCLUDED_CAMERA_PAIRS,
    SyntheticCrossModalReID,
    read_market1501,
    read_sysu_mm01,
    synthetic_reid,
)
from models.reid_net import ReIDLoss, ReIDNet, batch_hard_triplet_loss
from utils.reid_eval import cosine_distance, evaluate_rank, retrieval_metrics


# ------------------------------------------------------------------------------------------------ metrics
def reference_rank(dist: np.ndarray, qp, gp, qc, gc, max_rank: int, pairs=()) -> tuple[np.ndarray, float]:
    """Straightforward per-query loop (the torchreid/SYSU formulation), to check the vectorised one."""
    cmc_sum, aps, nv = np.zeros(max_rank), [], 0
    for i in range(len(qp)):
        order = np.argsort(dist[i], kind="stable")
        keep = [j for j in order if not (gp[j] == qp[i] and (gc[j] == qc[i] or (qc[i], gc[j]) in pairs))]
        m = np.array([gp[j] == qp[i] for j in keep])
        if not m.any():
            continue
        nv += 1
        first = int(np.argmax(m))
        cmc_sum[first:] += 1
        hits = np.cumsum(m)
        aps.append(np.mean([hits[k] / (k + 1) for k in np.flatnonzero(m)]))
    return cmc_sum / nv, float(np.mean(aps))


@pytest.mark.parametrize("seed", range(5))
def test_evaluate_rank_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nq, ng = 23, 57
    qp, gp = rng.integers(0, 8, nq), rng.integers(0, 8, ng)
    qc, gc = rng.integers(1, 7, nq), rng.integers(1, 7, ng)
    dist = rng.random((nq, ng))
    pairs = SYSU_EXCLUDED_CAMERA_PAIRS if seed % 2 else ()
    cmc, mAP, nv = evaluate_rank(dist, qp, gp, qc, gc, 10, pairs, chunk=7)
    ref_cmc, ref_map = reference_rank(dist, qp, gp, qc, gc, 10, pairs)
    np.testing.assert_allclose(cmc, ref_cmc)
    assert mAP == pytest.approx(ref_map)
    assert 0 < nv <= nq


def test_perfect_ranking_and_same_camera_exclusion() -> None:
    q_pids, g_pids = np.array([1, 2]), np.array([1, 2, 1, 2])
    q_cams, g_cams = np.array([3, 3]), np.array([1, 1, 3, 3])
    feats_q = np.array([[1.0, 0.0], [0.0, 1.0]])
    feats_g = np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 0.0], [0.0, 1.0]])
    cmc, mAP, nv = evaluate_rank(cosine_distance(feats_q, feats_g), q_pids, g_pids, q_cams, g_cams, 2)
    assert mAP == 1.0 and cmc[0] == 1.0 and nv == 2
    # with cam1 excluded for cam3 queries nothing true is left: a clear error, not a silent 0
    with pytest.raises(ValueError, match="no query has a true match"):
        evaluate_rank(cosine_distance(feats_q, feats_g), q_pids, g_pids, q_cams, g_cams, 2, ((3, 1),))


# ----------------------------------------------------------------------------------------------- datasets
def test_synthetic_set_shapes_modalities_and_determinism() -> None:
    ds = SyntheticCrossModalReID(num_identities=6, samples_per_id=8, image_size=(32, 16), seed=3)
    x = ds[0]
    assert x["image"].shape == (3, 32, 16) and x["image"].dtype == torch.float32
    assert set(np.unique(ds.modalities)) == {"rgb", "ir"}
    assert set(ds.camids[ds.modalities == "ir"]) <= {3, 6} and set(ds.camids[ds.modalities == "rgb"]) <= {
        1,
        2,
        4,
        5,
    }
    assert ds.num_classes == 6 and sorted(set(ds.labels.tolist())) == list(range(6))
    # IR = one intensity replicated to 3 channels: equal after undoing the per-channel normalisation
    ir = ds.images[torch.as_tensor(ds.modalities == "ir")]
    raw = ir * torch.tensor(STD)[:, None, None] + torch.tensor(MEAN)[:, None, None]
    assert torch.allclose(raw[:, 0], raw[:, 1], atol=1e-5) and torch.allclose(raw[:, 0], raw[:, 2], atol=1e-5)
    rgb = ds.images[torch.as_tensor(ds.modalities == "rgb")]
    raw = rgb * torch.tensor(STD)[:, None, None] + torch.tensor(MEAN)[:, None, None]
    assert not torch.allclose(raw[:, 0], raw[:, 1], atol=1e-2)
    again = SyntheticCrossModalReID(num_identities=6, samples_per_id=8, image_size=(32, 16), seed=3)
    assert torch.equal(ds.images, again.images)
    batch = ds.gather(torch.tensor([0, 5, 9]))
    assert (
        torch.equal(batch["image"], ds.images[[0, 5, 9]])
        and batch["pid"].tolist() == ds.pids[[0, 5, 9]].tolist()
    )


def test_synthetic_train_test_identities_disjoint() -> None:
    train, ev = synthetic_reid(8, 4, samples_per_id=6, image_size=(32, 16))
    assert not set(train.pids.tolist()) & set(ev.dataset.pids.tolist())
    q, g = ev.protocols["rgb2ir"]
    assert (ev.dataset.modalities[q] == "rgb").all() and (ev.dataset.modalities[g] == "ir").all()


def _write_img(path: Path, colour: tuple[int, int, int], mode: str = "RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (8, 16), colour if mode == "RGB" else colour[0]).save(path)


def test_market1501_reader(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    for folder, names in {
        "bounding_box_train": [
            "0002_c1s1_000451_03.jpg",
            "0002_c2s1_000551_01.jpg",
            "0007_c3s1_000001_01.jpg",
            "-1_c1s1_000001_00.jpg",
            "0000_c1s1_000002_00.jpg",
        ],
        "query": ["0003_c1s1_000001_00.jpg"],
        "bounding_box_test": [
            "0003_c2s1_000002_00.jpg",
            "0003_c1s1_000003_00.jpg",
            "0004_c2s1_000004_00.jpg",
            "-1_c1s1_000004_00.jpg",
        ],
    }.items():
        for n in names:
            _write_img(tmp_path / folder / n, (200, 30, 30))
    train, ev = read_market1501(tmp_path, image_size=(16, 8))
    assert sorted(train.pids.tolist()) == [2, 2, 7], "junk -1 and distractor 0000 are skipped"
    assert train.camids.tolist() == [1, 2, 3] and train.num_classes == 2
    x = train[0]["image"]
    assert x.shape == (3, 16, 8)
    red = (200 / 255 - MEAN[0]) / STD[0]
    assert x[0].mean().item() == pytest.approx(red, abs=0.05)
    q, g = ev.protocols[""]
    assert len(q) == 1 and len(g) == 3
    with pytest.raises(FileNotFoundError, match="bounding_box_train"):
        read_market1501(tmp_path / "missing")


def test_sysu_reader(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "train_id.txt").write_text("1,2")
    (tmp_path / "exp" / "val_id.txt").write_text("3")
    (tmp_path / "exp" / "test_id.txt").write_text("4,5\n")
    for cam in (2, 5):  # cameras present but without images of these ids
        (tmp_path / f"cam{cam}").mkdir()
    for pid in (1, 2, 3, 4, 5):
        for cam in (1, 3, 4, 6):
            for k in range(2):
                _write_img(
                    tmp_path / f"cam{cam}" / f"{pid:04d}" / f"{k + 1:04d}.jpg",
                    (90, 90, 90),
                    mode="RGB" if cam in (1, 4) else "L",
                )
    train, ev = read_sysu_mm01(tmp_path, image_size=(16, 8), single_shot=True, seed=0)
    assert sorted(set(train.pids.tolist())) == [1, 2, 3] and train.num_classes == 3
    assert set(train.modalities[train.camids == 3]) == {"ir"} and set(
        train.modalities[train.camids == 1]
    ) == {"rgb"}
    assert train[len(train) - 1]["image"].shape == (3, 16, 8)  # grey IR file -> 3 channels
    q, g = ev.protocols["ir2rgb"]
    assert len(q) == 2 * 2 * 2  # all IR images of the 2 test ids
    assert len(g) == 2 * 2  # single shot: one per (id, RGB camera)
    assert ev.excluded_camera_pairs == SYSU_EXCLUDED_CAMERA_PAIRS
    # the sampler reads these arrays directly
    s = CachedModalAwarePKSampler(train, 6, 2, seed=0)
    assert s.num_pairable_ids == 3


# ------------------------------------------------------------------------------------------ model, losses
def test_model_outputs_and_loss_backward() -> None:
    torch.manual_seed(0)
    m = ReIDNet(num_classes=5, width=8)
    x = torch.randn(8, 3, 32, 16)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    out = m(x)
    assert out["features"].shape == (8, 64) and out["logits"].shape == (8, 5)
    loss = ReIDLoss()(out, labels)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert m.bnneck.bias.grad is None, "BNNeck bias is frozen"
    assert all(p.grad is not None for n, p in m.named_parameters() if p.requires_grad)
    m.eval()
    assert "logits" not in m(x)


def test_batch_hard_triplet() -> None:
    labels = torch.tensor([0, 0, 1, 1])
    far = torch.tensor([[0.0, 0.0], [0.1, 0.0], [10.0, 0.0], [10.1, 0.0]])
    assert batch_hard_triplet_loss(far, labels, margin=0.3).item() == 0.0
    mixed = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.1, 0.0], [10.1, 0.0]])
    # hardest positive 10, hardest negative 0.1 -> 0.3 + 10 - 0.1 for every anchor
    assert batch_hard_triplet_loss(mixed, labels, margin=0.3).item() == pytest.approx(10.2, abs=1e-4)
    single = batch_hard_triplet_loss(torch.randn(3, 4), torch.tensor([0, 0, 0]))
    assert single.item() == 0.0, "no negatives -> no loss"


def test_bad_inputs_are_named() -> None:
    from tasks.reid import build_reid_task

    with pytest.raises(ValueError, match="--reid_format"):
        build_reid_task(reid_format="duke")
    with pytest.raises(ValueError, match="--data_path"):
        build_reid_task(reid_format="sysu")
    with pytest.raises(ValueError, match="num_classes=1"):
        ReIDNet(1)


# ------------------------------------------------------------------------------------------------- task
def test_task_short_training_beats_chance() -> None:
    """A hand loop (model, loss_fn, sampler, DataLoader, evaluate_fn) as the engine would run it."""
    from tasks.reid import build_reid_task

    torch.manual_seed(0)
    task = build_reid_task(num_identities=32, image_size=(32, 16), seed=1, width=16)
    assert task.monitor_metric == "rgb2ir_mAP" and task.monitor_mode == "max"
    ev = task.val_set
    ds = ev.dataset
    # chance: the mean over random features of the same protocol
    rng = np.random.default_rng(0)
    chance = np.mean(
        [
            retrieval_metrics(rng.standard_normal((len(ds), 16)), ds.pids, ds.camids, ev.protocols)[
                "rgb2ir_mAP"
            ]
            for _ in range(5)
        ]
    )
    sampler = task.batch_sampler_fn(task.train_set, 32, seed=1, rank=0, world_size=1, drop_last=True)
    assert isinstance(sampler, CachedModalAwarePKSampler) and sampler.num_ids_per_batch == 8
    opt = torch.optim.Adam(task.model.parameters(), lr=1e-3)
    loader = DataLoader(task.train_set, batch_sampler=sampler)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # other test processes share the CPU; oversubscribed threads run ~3x slower
    try:
        steps = 0
        for epoch in range(30):
            sampler.set_epoch(epoch)
            for batch in loader:
                loss = task.loss_fn(task.model, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
        scores = task.evaluate_fn(task.model, "val", torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert set(scores) >= {
        "rgb2ir_mAP",
        "rgb2ir_rank1",
        "rgb2ir_rank5",
        "rgb2ir_rank10",
        "ir2rgb_mAP",
        "ir2rgb_rank1",
    }
    assert task.model.training, "evaluate_fn restores train mode"
    assert scores["rgb2ir_mAP"] > 2 * chance, (scores, chance, steps)

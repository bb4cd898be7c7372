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
from utils.reid_eval import cosine_distance, evaluate_rank, retrieval_metrics, score_names


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
    assert torch.equal(batch["image"], ds.images[[0, 5, 9]]) and batch["pid"].tolist() == ds.pids[[0, 5, 9]].tolist()


def test_synthetic_train_val_test_identities_disjoint() -> None:
    train, val, ev = synthetic_reid(8, 4, samples_per_id=6, image_size=(32, 16), num_val_identities=3)
    tr, va, te = (set(d.pids.tolist()) for d in (train, val.dataset, ev.dataset))
    assert len(va) == 3 and len(te) == 4 and not (tr & va or tr & te or va & te)
    assert synthetic_reid(8, 4, samples_per_id=6, image_size=(32, 16))[1] is None
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
    train, val, ev = read_market1501(tmp_path, image_size=(16, 8), val_fraction=0)
    assert val is None
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
    train, val, ev = read_sysu_mm01(tmp_path, image_size=(16, 8), seed=0)
    assert sorted(set(train.pids.tolist())) == [1, 2] and train.num_classes == 2, "val ids held out"
    assert set(val.dataset.pids.tolist()) == {3} and set(ev.dataset.pids.tolist()) == {4, 5}
    assert set(train.modalities[train.camids == 3]) == {"ir"} and set(train.modalities[train.camids == 1]) == {"rgb"}
    assert train[len(train) - 1]["image"].shape == (3, 16, 8)  # grey IR file -> 3 channels
    q, galleries = ev.protocols["allsearch"]
    assert len(q) == 2 * 2 * 2  # all IR images of the 2 test ids
    assert len(galleries) == 10 and all(len(g) == 2 * 2 for g in galleries)  # one per (id, RGB camera)
    q_in, g_in = ev.protocols["indoor"]
    assert (q_in == q).all() and all(set(ev.dataset.camids[g].tolist()) == {1} for g in g_in)
    assert ev.excluded_camera_pairs == SYSU_EXCLUDED_CAMERA_PAIRS and ev.ranks == (1, 10, 20)
    merged, no_val, _ = read_sysu_mm01(tmp_path, image_size=(16, 8), hold_out_val_ids=False)
    assert sorted(set(merged.pids.tolist())) == [1, 2, 3] and no_val is None
    # the sampler reads these arrays directly
    s = CachedModalAwarePKSampler(merged, 6, 2, seed=0)
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
@pytest.mark.slow
def test_task_short_training_beats_chance() -> None:
    """A hand loop (model, loss_fn, sampler, DataLoader, evaluate_fn) as the engine would run it."""
    from tasks.reid import build_reid_task

    torch.manual_seed(0)
    task = build_reid_task(num_identities=32, image_size=(32, 16), seed=1, width=16)
    assert task.monitor_metric == "val_rgb2ir_mAP" and task.monitor_mode == "max"
    ev = task.test_set
    ds = ev.dataset
    # chance: the mean over random features of the same protocol
    rng = np.random.default_rng(0)
    chance = np.mean(
        [
            retrieval_metrics(rng.standard_normal((len(ds), 16)), ds.pids, ds.camids, ev.protocols)["rgb2ir_mAP"]
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
        scores = task.evaluate_fn(task.model, "test", torch.device("cpu"))
        val_scores = task.evaluate_fn(task.model, "val", torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert set(scores) >= {
        "test_rgb2ir_mAP",
        "test_rgb2ir_rank1",
        "test_rgb2ir_rank5",
        "test_rgb2ir_rank10",
        "test_ir2rgb_mAP",
        "test_ir2rgb_rank1",
    }
    assert "val_rgb2ir_mAP" in val_scores and val_scores != {k.replace("test_", "val_"): v for k, v in scores.items()}
    assert task.model.training, "evaluate_fn restores train mode"
    assert scores["test_rgb2ir_mAP"] > 2 * chance, (scores, chance, steps)


# ---------------------------------------------------------------------------------------- protocol (issue 11)
def test_market1501_holds_out_validation_identities(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    for pid in range(1, 11):
        for cam in (1, 2):
            for k in range(2):
                _write_img(tmp_path / "bounding_box_train" / f"{pid:04d}_c{cam}s1_{k:06d}_00.jpg", (10 * pid, 0, 0))
    _write_img(tmp_path / "query" / "0101_c1s1_000001_00.jpg", (0, 0, 0))
    _write_img(tmp_path / "bounding_box_test" / "0101_c2s1_000001_00.jpg", (0, 0, 0))
    train, val, test = read_market1501(tmp_path, image_size=(16, 8), val_fraction=0.2, seed=3)
    va = set(val.dataset.pids.tolist())
    assert len(va) == 2 and not va & set(train.pids.tolist()) and train.num_classes == 8
    assert (val.dataset.labels == -1).all(), "validation identities are not classes"
    assert read_market1501(tmp_path, image_size=(16, 8), val_fraction=0.2, seed=3)[1].dataset.paths == val.dataset.paths
    q, g = val.protocols[""]
    assert len(q) == 2 * 2 and len(g) == 2 * 2 * 2 - 4  # one query per (id, camera), the rest is gallery
    feats = np.eye(20)[val.dataset.pids]  # perfect features: every query finds its identity first
    assert retrieval_metrics(feats, val.dataset.pids, val.dataset.camids, val.protocols)["mAP"] == 1.0
    with pytest.raises(ValueError, match="fewer than 2 to train on"):
        read_market1501(tmp_path, image_size=(16, 8), val_fraction=0.9)


def test_image_folder_runs_print_a_data_line(tmp_path: Path) -> None:
    """The synthetic set and ERA5 said where their data came from; SYSU/Market folder runs printed no `data:` line."""
    pytest.importorskip("PIL")
    from tasks.reid import build_reid_task
    from train_optimized import data_lines

    for pid in range(1, 11):
        for cam in (1, 2):
            for frame in (1, 2):  # two per camera: a validation query leaves a gallery image behind
                name = f"{pid:04d}_c{cam}s1_00000{frame}_00.jpg"
                _write_img(tmp_path / "bounding_box_train" / name, (10 * pid, 0, 0))
    _write_img(tmp_path / "query" / "0101_c1s1_000001_00.jpg", (0, 0, 0))
    for k in range(3):
        _write_img(tmp_path / "bounding_box_test" / f"0101_c2s1_00000{k}_00.jpg", (0, 0, 0))
    task = build_reid_task(data_path=str(tmp_path), reid_format="market1501", val_fraction=0.2, width=4)
    assert data_lines(task) == [
        f"data: {tmp_path} (Market-1501 folder); train 8 identities / 32 images, val 2 identities / 8 images, "
        "test 1 identity / 4 images"
    ]
    task = build_reid_task(data_path=str(tmp_path), reid_format="market1501", val_fraction=0, width=4)
    assert "val none (--val_fraction 0)" in data_lines(task)[0]
    assert data_lines(build_reid_task(num_identities=8, width=4))[0].startswith("data: the built-in SYNTHETIC")


def test_trial_galleries_give_mean_and_std() -> None:
    rng = np.random.default_rng(0)
    n = 60
    pids, cams = rng.integers(0, 6, n), rng.integers(1, 5, n)
    feats = rng.standard_normal((n, 8))
    q = np.arange(12)
    trials = [np.sort(rng.choice(np.arange(12, n), 20, replace=False)) for _ in range(4)]
    out = retrieval_metrics(feats, pids, cams, {"p": (q, trials)}, ranks=(1, 10))
    singles = [retrieval_metrics(feats, pids, cams, {"p": (q, g)}, ranks=(1, 10)) for g in trials]
    for key in ("p_mAP", "p_rank1", "p_rank10"):
        vals = [s[key] for s in singles]
        assert out[key] == pytest.approx(np.mean(vals)) and out[f"{key}_std"] == pytest.approx(np.std(vals))
    assert out["p_trials"] == 4 and "p_mAP_std" not in singles[0]
    pre = retrieval_metrics(feats, pids, cams, {"p": (q, trials[0])}, prefix="val_")
    assert set(pre) == {"val_p_mAP", "val_p_rank1", "val_p_rank5", "val_p_rank10"}
    # the console shows the scores, not the number of gallery draws ("val_allsearch_trials: 10.0000")
    protocols = {"p": (q, trials), "": (q, trials[0])}
    both = retrieval_metrics(feats, pids, cams, protocols, ranks=(1, 10), prefix="val_")
    assert set(score_names(protocols, (1, 10), "val_")) == set(both) - {"val_p_trials"}


def test_sysu_protocol_draws_and_cam2_cam3_exclusion() -> None:
    from datasets.reid import sysu_protocols

    class Meta:  # 3 ids seen by every camera, 3 images per (id, camera)
        pids = np.repeat(np.arange(3), 6 * 3)
        camids = np.tile(np.repeat(np.arange(1, 7), 3), 3)

    prot = sysu_protocols(Meta, trials=10, seed=5)
    q, all_g = prot["allsearch"]
    assert set(Meta.camids[q].tolist()) == {3, 6}
    assert len({tuple(g) for g in all_g}) > 1, "the 10 draws differ"
    for g in all_g:  # single shot: one image per (id, camera), RGB cameras only
        assert len(g) == 3 * 4 and set(Meta.camids[g].tolist()) == {1, 2, 4, 5}
    assert all(set(Meta.camids[g].tolist()) == {1, 2} for g in prot["indoor"][1])
    assert [tuple(g) for g in sysu_protocols(Meta, trials=10, seed=5)["allsearch"][1]] == [tuple(g) for g in all_g]
    # features that match a cam3 query only with its identity's cam2 images: excluded, so not a hit
    feats = np.zeros((len(Meta.pids), 6))
    feats[np.arange(len(Meta.pids)), Meta.pids] = 1.0
    feats[(Meta.camids == 2) | (Meta.camids == 3), 3 + Meta.pids[(Meta.camids == 2) | (Meta.camids == 3)]] = 5.0
    cam3 = {"allsearch": (q[Meta.camids[q] == 3], all_g)}
    with_rule = retrieval_metrics(feats, Meta.pids, Meta.camids, cam3, SYSU_EXCLUDED_CAMERA_PAIRS)
    without = retrieval_metrics(feats, Meta.pids, Meta.camids, cam3)
    assert without["allsearch_rank1"] == 1.0 and with_rule["allsearch_rank1"] == 1.0
    assert with_rule["allsearch_mAP"] == 1.0  # the remaining same-id gallery images rank first
    with pytest.raises(ValueError, match="trials=0"):
        sysu_protocols(Meta, trials=0)


def test_task_options_help_and_validation() -> None:
    import inspect

    from tasks.reid import ARGS_HELP, build_reid_task

    params = [p for p in inspect.signature(build_reid_task).parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert set(ARGS_HELP) == {p.name for p in params}, "one help entry per option"
    sig = inspect.signature(build_reid_task).parameters
    for k, v in ARGS_HELP.items():  # a default in the text only where the signature's is None (per format)
        assert isinstance(v, str) and v and ("default:" not in v or sig[k].default is None), k
    task = build_reid_task(num_identities=16, image_size=(32, 16), ce_weight=0.5, margin=0.2, channel_aug=0.25,
                           val_fraction=0.25, epoch_length="5")  # fmt: skip
    assert task.info["loss"] == {
        "label_smoothing": 0.1,
        "triplet_margin": 0.2,
        "ce_weight": 0.5,
        "channel_aug": 0.25,
    }
    assert task.info["val_identities"] == 4 and task.info["test_identities"] == 8
    sampler = task.batch_sampler_fn(task.train_set, 16, seed=0, rank=0, world_size=1, drop_last=True)
    assert len(sampler) == 5 and "CachedModalAwarePKSampler" in task.info["sampler"]
    assert task.info["sampler_cache"]["batches_per_epoch"] == 5
    assert build_reid_task(num_identities=16, image_size=(32, 16), val_fraction=0).val_set is None
    for kw, match in (({"channel_aug": 1.5}, "--channel_aug"), ({"margin": -1}, "--margin"),
                      ({"ce_weight": -0.1}, "--ce_weight"), ({"val_fraction": 1.0}, "--val_fraction"),
                      ({"epoch_length": "often"}, "--epoch_length"),
                      ({"epoch_length": "seed", "num_passes": 2}, "give one of them")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            build_reid_task(num_identities=16, image_size=(32, 16), **kw)


def test_step_metrics_are_feature_norms_on_the_device_without_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.reid import build_reid_task

    task = build_reid_task(num_identities=16, image_size=(32, 16))
    assert task.step_metrics() == {}, "nothing before the first step"
    batch = task.train_set.gather(torch.arange(16))
    calls = []
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append(1))
    loss = task.loss_fn(task.model, batch)
    metrics = task.step_metrics()
    monkeypatch.undo()
    assert not calls, "no host read-back in loss_fn or step_metrics"
    assert set(metrics) == {"feat_norm", "bn_feat_norm"}
    assert all(v.ndim == 0 and v.device == loss.device for v in metrics.values())
    with torch.no_grad():
        out = task.model(batch["image"])
    torch.testing.assert_close(metrics["feat_norm"], out["features"].norm(dim=1).mean())


def _tiny_run(tmp_path: Path, seed: int, name: str) -> dict[str, torch.Tensor]:
    from tasks.reid import build_reid_task
    from trainer import TrainConfig, Trainer

    task = build_reid_task(num_identities=16, image_size=(32, 16), width=8, seed=seed, channel_aug=0.5)
    cfg = TrainConfig(seed=seed, batch_size=16, max_steps=3, output_dir=str(tmp_path), run_name=name,
                      progress_bar=False, validation_interval=10**6, save_best=False, log_every=2)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # other test processes share the CPU; oversubscribed threads run ~3x slower
    try:
        trainer = Trainer(cfg, task, log=lambda m: None)
        trainer.fit()
    finally:
        torch.set_num_threads(threads)
    return {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}


def test_seed_makes_two_runs_identical(tmp_path: Path) -> None:
    """--seed seeds everything: data, held-out ids, initial weights, sampler, channel augmentation."""
    torch.manual_seed(123)  # a different global state before each build must not matter
    a = _tiny_run(tmp_path, 7, "a")
    torch.manual_seed(456)
    b = _tiny_run(tmp_path, 7, "b")
    c = _tiny_run(tmp_path, 8, "c")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_sysu_task_scores_the_standard_protocol(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from tasks.reid import build_reid_task

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "train_id.txt").write_text("1,2,3")
    (tmp_path / "exp" / "val_id.txt").write_text("4,5")
    (tmp_path / "exp" / "test_id.txt").write_text("6,7")
    for pid in range(1, 8):
        for cam in range(1, 7):
            for k in range(2):
                _write_img(tmp_path / f"cam{cam}" / f"{pid:04d}" / f"{k:04d}.jpg", (30 * pid, 20 * cam, 9 * k),
                           mode="RGB" if cam in (1, 2, 4, 5) else "L")  # fmt: skip
    task = build_reid_task(data_path=str(tmp_path), reid_format="sysu", image_size=(16, 8), width=4, num_instances=2)
    assert task.monitor_metric == "val_allsearch_mAP"
    assert task.info["train_identities"] == 3 and task.info["val_identities"] == 2
    assert task.info["protocols"]["allsearch"] == [2 * 2 * 2, "10 trials"]
    scores = task.evaluate_fn(task.model, "test", torch.device("cpu"))
    for name in ("allsearch", "indoor"):
        for key in ("mAP", "rank1", "rank10", "rank20"):
            assert 0 <= scores[f"test_{name}_{key}"] <= 1 and f"test_{name}_{key}_std" in scores
        assert scores[f"test_{name}_trials"] == 10
    val_scores = task.evaluate_fn(task.model, "val", torch.device("cpu"))
    assert set(val_scores) == {k.replace("test_", "val_") for k in scores}
    shown = set(task.console_metrics or ())
    assert "val_allsearch_trials" not in shown and "test_allsearch_trials" not in shown  # a count, not a score
    assert shown == {k for k in {**scores, **val_scores} if not k.endswith("_trials")}
    with pytest.raises(ValueError, match="exp/val_id.txt"):
        build_reid_task(data_path=str(tmp_path), reid_format="sysu", val_fraction=0.2)
    assert build_reid_task(data_path=str(tmp_path), reid_format="sysu", val_fraction=0, width=4).val_set is None


@pytest.mark.parametrize("k", [2, 3, 4, 6])
@pytest.mark.parametrize("data_path", [None, "/data/SYSU-MM01"])
@pytest.mark.parametrize("on_gpu", [False, True])
def test_cli_default_batch_is_p_times_k(k: int, data_path: str | None, on_gpu: bool) -> None:
    """The engine's batch 150 is no P x K batch (150 % 4 != 0): `--task reid --data_path ... --reid_format sysu`
    and `--task reid` on a GPU failed before training with "batch_size=150 is not divisible by num_instances=4"."""
    from tasks import train_defaults

    kw = {"num_instances": k, "data_path": data_path}
    d = train_defaults("reid", on_gpu, kw, 1000)
    assert d["batch_size"] % k == 0 and d["test_with_best"] is True
    small = data_path is None and not on_gpu
    assert d["batch_size"] == (8 if small else 16) * k
    assert ("epochs" in d) == small
    assert train_defaults("reid", on_gpu, {"data_path": data_path}, 1000)["batch_size"] == (32 if small else 64)


def test_missing_data_path_names_the_flag_and_the_layout(tmp_path: Path) -> None:
    from tasks.reid import build_reid_task

    with pytest.raises(FileNotFoundError, match=r"--data_path .*nope: no such directory; give the SYSU-MM01 folder"):
        build_reid_task(data_path=str(tmp_path / "nope"), reid_format="sysu")
    f = tmp_path / "train_id.txt"
    f.write_text("1")
    with pytest.raises(FileNotFoundError, match="is a file, not a directory; give the extracted Market-1501"):
        build_reid_task(data_path=str(f), reid_format="market1501")


def _market(root: Path) -> None:
    for folder, names in {
        "bounding_box_train": ["0002_c1s1_000451_03.jpg", "0002_c2s1_000551_01.jpg", "0007_c3s1_000001_01.jpg",
                               "0007_c1s1_000002_01.jpg", "0009_c1s1_000003_01.jpg", "0009_c2s1_000004_01.jpg"],
        "query": ["0003_c1s1_000001_00.jpg"],
        "bounding_box_test": ["0003_c2s1_000002_00.jpg", "0004_c2s1_000004_00.jpg"],
    }.items():  # fmt: skip
        for n in names:
            _write_img(root / folder / n, (200, 30, 30))


@pytest.mark.parametrize("split", ["bounding_box_train", "query", "bounding_box_test"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "directory", "not_an_image"])
def test_bad_image_in_any_split_is_one_line_before_training(tmp_path: Path, split: str, damage: str) -> None:
    """A zero-byte or truncated JPEG, a directory named *.jpg or a text file was a traceback (and a bad query/
    image met only after all training); every split is scanned when the task is built."""
    pytest.importorskip("PIL")
    from tasks.reid import build_reid_task

    _market(tmp_path)
    bad = tmp_path / split / "0005_c1s1_000009_01.jpg"
    if damage == "directory":
        bad.mkdir()
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "not_an_image":
        bad.write_text("hello", encoding="utf-8")
    else:
        from PIL import Image

        Image.effect_noise((64, 128), 60).convert("RGB").save(bad, quality=95)
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # cut in the middle of the scan data
    with pytest.raises(ValueError) as e:
        build_reid_task(data_path=str(tmp_path), reid_format="market1501", val_fraction=0, width=4)
    msg = str(e.value)
    assert msg.startswith(str(bad)) and "\n" not in msg and "remove or replace it" in msg


def test_bad_sysu_image_and_id_list_are_named(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    (tmp_path / "exp").mkdir()
    for name, ids in (("train_id.txt", "1,2"), ("val_id.txt", "3"), ("test_id.txt", "4")):
        (tmp_path / "exp" / name).write_text(ids)
    for pid in (1, 2, 3, 4):
        for cam in (1, 3):
            _write_img(tmp_path / f"cam{cam}" / f"{pid:04d}" / "0001.jpg", (90, 90, 90))
    for cam in (2, 4, 5, 6):
        (tmp_path / f"cam{cam}").mkdir()
    bad = tmp_path / "cam3" / "0003" / "0002.jpg"  # a validation identity's image
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match=f"^{bad}: is empty"):
        read_sysu_mm01(tmp_path, image_size=(16, 8))
    bad.unlink()
    (tmp_path / "exp" / "test_id.txt").write_bytes(b"\xff\xfe4")
    with pytest.raises(ValueError, match="test_id.txt: not a list of identity numbers"):
        read_sysu_mm01(tmp_path, image_size=(16, 8))


@pytest.mark.parametrize(
    "kw, flag",
    [({"margin": float("nan")}, "--margin"), ({"image_size": (0, 0)}, "--image_size"),
     ({"eval_workers": -2}, "--eval_workers"), ({"label_smoothing": float("inf")}, "--label_smoothing"),
     ({"num_instances": 0}, "--num_instances"), ({"width": 2.5}, "--width")],
)  # fmt: skip
def test_builder_checks_its_arguments_by_their_rules(kw: dict, flag: str) -> None:
    """The builder checks with ARGS_RULES, the rules the CLI and config files use: one line naming the flag."""
    from tasks.reid import build_reid_task

    with pytest.raises(ValueError) as e:
        build_reid_task(num_identities=16, **kw)
    assert str(e.value).startswith(flag) and "use" in str(e.value)

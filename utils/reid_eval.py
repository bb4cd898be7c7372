"""Re-ID retrieval metrics: mAP and CMC rank-k from a query x gallery distance matrix (numpy only).

Protocol (Market-1501 / SYSU-MM01): for each query, gallery samples with the same identity AND the same
camera are removed (they are trivially easy), and so are those of any camera pair listed in
`excluded_camera_pairs` as (query cam, gallery cam) for the same identity — SYSU-MM01 removes cam2
gallery images for cam3 queries because both cameras film the same room. Queries left without any true
match are skipped (their count is returned). CMC(k) = fraction of queries with a true match in the top k;
AP = mean over the true matches of precision at their rank; mAP = mean AP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def evaluate_rank(
    distmat: np.ndarray,
    q_pids: np.ndarray,
    g_pids: np.ndarray,
    q_camids: np.ndarray,
    g_camids: np.ndarray,
    max_rank: int = 10,
    excluded_camera_pairs: Sequence[tuple[int, int]] = (),
    chunk: int = 512,
) -> tuple[np.ndarray, float, int]:
    """-> (cmc[max_rank], mAP, number of valid queries). Smaller distance = more similar."""
    distmat = np.asarray(distmat)
    nq, ng = distmat.shape
    if nq != len(q_pids) or ng != len(g_pids) or len(q_camids) != nq or len(g_camids) != ng:
        raise ValueError(
            f"evaluate_rank: distmat {distmat.shape} does not match {len(q_pids)} queries / {len(g_pids)} gallery"
        )
    if ng == 0 or nq == 0:
        raise ValueError("evaluate_rank: empty query or gallery set")
    firsts, aps = [], []
    # queries in chunks: the per-query boolean/int matrices of a Market-sized test (3,368 x 15,913) would
    # otherwise take gigabytes
    for s in range(0, nq, chunk):
        f, a = _rank_chunk(
            distmat[s : s + chunk],
            np.asarray(q_pids)[s : s + chunk],
            np.asarray(g_pids),
            np.asarray(q_camids)[s : s + chunk],
            np.asarray(g_camids),
            excluded_camera_pairs,
        )
        firsts.append(f)
        aps.append(a)
    first, ap = np.concatenate(firsts), np.concatenate(aps)
    n_valid = len(first)
    if n_valid == 0:
        raise ValueError("evaluate_rank: no query has a true match in the gallery (check ids and camera exclusion)")
    cmc = np.array([(first <= k).mean() for k in range(1, max_rank + 1)])
    return cmc, float(ap.mean()), n_valid


def _rank_chunk(
    distmat: np.ndarray,
    q_pids: np.ndarray,
    g_pids: np.ndarray,
    q_camids: np.ndarray,
    g_camids: np.ndarray,
    excluded_camera_pairs: Sequence[tuple[int, int]],
) -> tuple[np.ndarray, np.ndarray]:
    """(rank of the first true match, AP) of each query with at least one true match."""
    order = np.argsort(distmat, axis=1, kind="stable")
    gp, gc = g_pids[order], g_camids[order]
    qp, qc = q_pids[:, None], q_camids[:, None]
    same_id = gp == qp
    removed = same_id & (gc == qc)
    for qcam, gcam in excluded_camera_pairs:
        removed |= same_id & (qc == qcam) & (gc == gcam)
    keep = ~removed
    match = same_id & keep
    valid = match.any(1)
    match, keep = match[valid], keep[valid]
    rank_pos = np.cumsum(keep, axis=1)  # 1-based rank among kept items (removed ones take no place)
    hits = np.cumsum(match, axis=1)
    first = np.where(match, rank_pos, np.iinfo(np.int64).max).min(1)
    ap = np.where(match, hits / np.maximum(rank_pos, 1), 0.0).sum(1) / match.sum(1)
    return first, ap


def cosine_distance(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """1 - cosine similarity, rows L2-normalised here."""
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    g = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
    return 1.0 - q @ g.T


def _galleries(gi: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """A protocol's gallery as a list of trials: one index array, or one per random draw."""
    return [np.asarray(gi)] if isinstance(gi, np.ndarray) else [np.asarray(g) for g in gi]


def _score_keys(prefix: str, name: str, ranks: Sequence[int]) -> tuple[str, list[str]]:
    """(key prefix, [mAP, rank-k keys]) of one protocol, as `retrieval_metrics` names them."""
    pre = prefix + (f"{name}_" if name else "")
    return pre, [f"{pre}mAP"] + [f"{pre}rank{k}" for k in ranks]


def retrieval_metrics(
    features: np.ndarray,
    pids: np.ndarray,
    camids: np.ndarray,
    protocols: Mapping[str, tuple[np.ndarray, np.ndarray | Sequence[np.ndarray]]],
    excluded_camera_pairs: Sequence[tuple[int, int]] = (),
    ranks: Sequence[int] = (1, 5, 10),
    prefix: str = "",
) -> dict[str, float]:
    """{"<prefix><protocol>_mAP", "<prefix><protocol>_rank1", ...} for each named (query idx, gallery idx)
    protocol; the empty name gives plain "mAP", "rank1". A gallery given as a list of index arrays is a
    set of random trials (SYSU-MM01: 10 single-shot gallery draws): each figure is the mean over the
    trials, with "<...>_std" beside it (population std over the trials) and "<...>_trials" = their number.
    """
    out: dict[str, float] = {}
    for name, (qi, gi) in protocols.items():
        qi = np.asarray(qi)
        trials = _galleries(gi)
        if not trials:
            raise ValueError(f"retrieval_metrics: protocol {name!r} has no gallery")
        pool = np.unique(np.concatenate(trials))
        dist_all = cosine_distance(features[qi], features[pool])  # once; each trial takes its columns
        per_trial = []
        for g in trials:
            dist = dist_all[:, np.searchsorted(pool, g)]
            cmc, mAP, _ = evaluate_rank(
                dist, pids[qi], pids[g], camids[qi], camids[g], max(ranks), excluded_camera_pairs
            )
            per_trial.append([mAP] + [float(cmc[min(k, len(cmc)) - 1]) for k in ranks])
        vals = np.asarray(per_trial)
        pre, keys = _score_keys(prefix, name, ranks)
        for j, key in enumerate(keys):
            out[key] = float(vals[:, j].mean())
            if len(trials) > 1:
                out[f"{key}_std"] = float(vals[:, j].std())
        if len(trials) > 1:
            out[f"{pre}trials"] = float(len(trials))
    return out


def score_names(
    protocols: Mapping[str, tuple[np.ndarray, np.ndarray | Sequence[np.ndarray]]],
    ranks: Sequence[int] = (1, 5, 10),
    prefix: str = "",
) -> tuple[str, ...]:
    """The scores `retrieval_metrics` returns for these protocols (mAP, rank-k and, over trials, their std),
    without "<...>_trials", which counts gallery draws and is no score: what a console line shows."""
    out: list[str] = []
    for name, (_, gi) in protocols.items():
        multi = len(_galleries(gi)) > 1
        for key in _score_keys(prefix, name, ranks)[1]:
            out += [key, f"{key}_std"] if multi else [key]
    return tuple(out)

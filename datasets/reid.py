"""Re-identification datasets: Market-1501 and SYSU-MM01 folder readers and a synthetic cross-modality set.

Every dataset here exposes, besides `__getitem__`, the metadata arrays the sampler reads once
(datasets/cached_sampler.py): `pids` (int64), `camids` (int64), `modalities` (numpy str array, "rgb" or
"ir"), and `labels` (pids mapped to 0..num_classes-1 for the classifier; -1 outside the training set).
A sample is a dict {"image": float32 (3, H, W) normalised, "label", "pid", "camid", "is_ir": int64}.

Evaluation sets are `ReIDEvalSet`: one dataset of all its images, plus named protocols, each a pair
(query indices, gallery indices), e.g. {"rgb2ir": (rgb_idx, ir_idx), "ir2rgb": (ir_idx, rgb_idx)}; a gallery
may also be a list of index arrays, one per random trial (SYSU-MM01's 10 single-shot galleries), scored as
mean and std over the trials.

Every reader returns (train, val, test): val is an evaluation set over identities held out from training
(it chooses best.pt), test is the benchmark's own test identities, never seen in training or model
selection. val is None when no identities are held out (val_fraction=0).

Only numpy, torch and (for image files) Pillow are imported.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

# ImageNet statistics: the usual choice for re-ID inputs; the synthetic set uses the same for uniformity
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IMG_EXTS = (".jpg", ".jpeg", ".png", ".bmp")
# Largest image a reader accepts, in pixels: person crops are a few hundred pixels on a side, and an image is
# decoded whole every epoch before it is resized, so a 12000 x 12000 file would cost 0.4 GB per look.
MAX_IMAGE_PIXELS = 4096 * 4096
SYSU_RGB_CAMS = (1, 2, 4, 5)
SYSU_IR_CAMS = (3, 6)
# SYSU-MM01 protocol: cam2 and cam3 film the same indoor scene, so for an IR query from cam3 the RGB
# gallery images of cam2 are excluded (and vice versa); same-camera matches are excluded always.
SYSU_EXCLUDED_CAMERA_PAIRS = ((3, 2), (2, 3))


# Named (query indices, gallery indices) pairs; a gallery may be a list of index arrays, one per random draw.
Protocols = dict[str, tuple[np.ndarray, np.ndarray | Sequence[np.ndarray]]]


class ReIDImages(Protocol):
    """What an evaluation set's images offer: samples, and the identity and camera of each."""

    pids: np.ndarray
    camids: np.ndarray

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]: ...


def _relabel(pids: np.ndarray) -> tuple[np.ndarray, int]:
    uniq, labels = np.unique(pids, return_inverse=True)
    return labels.astype(np.int64), len(uniq)


class _MetaMixin:
    pids: np.ndarray
    camids: np.ndarray
    modalities: np.ndarray
    labels: np.ndarray
    num_classes: int

    def _set_meta(
        self,
        pids: Sequence[int] | np.ndarray,
        camids: Sequence[int] | np.ndarray,
        modalities: Sequence[str] | np.ndarray,
        relabel: bool,
    ) -> None:
        self.pids = np.asarray(pids, dtype=np.int64)
        self.camids = np.asarray(camids, dtype=np.int64)
        self.modalities = np.asarray(modalities, dtype="<U3")
        if relabel and len(self.pids):
            self.labels, self.num_classes = _relabel(self.pids)
        else:
            self.labels, self.num_classes = np.full(len(self.pids), -1, dtype=np.int64), 0
        self.is_ir = (self.modalities != "rgb").astype(np.int64)

    def _meta_item(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "label": torch.tensor(self.labels[i]),
            "pid": torch.tensor(self.pids[i]),
            "camid": torch.tensor(self.camids[i]),
            "is_ir": torch.tensor(self.is_ir[i]),
        }


# ------------------------------------------------------------------------------------------- image files
def load_image(path: str | os.PathLike, size: tuple[int, int]) -> np.ndarray:
    """Decode with Pillow, convert to RGB (SYSU IR files are 3-channel already; grey files are
    replicated), resize to (H, W) bilinear, scale to [0, 1] -> float32 (H, W, 3)."""
    from PIL import Image  # optional dependency: only the folder readers need it

    with Image.open(path) as im:
        rgb = im.convert("RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.float32) / 255.0


def image_problem(path: str | os.PathLike, max_pixels: int | None = None) -> str | None:
    """Why the file at `path` cannot be read as an image (None: it can), found cheaply: the size comes from the
    header (Pillow opens lazily) and an image over `max_pixels` (default MAX_IMAGE_PIXELS) is refused undecoded;
    a JPEG is decoded in Pillow's draft mode (1/8 scale, which still reads the whole compressed stream, so
    truncation shows)."""
    from PIL import Image

    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if p.is_dir():
        return "is a directory, not an image file"
    if not p.is_file():
        return "is not a regular file"
    if st.st_size == 0:
        return "is empty (0 bytes)"
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    side = math.isqrt(max_pixels)
    too_big = (
        f"more than the {max_pixels:,} ({side} x {side}) a re-ID image may have (person crops are a few hundred "
        "pixels a side, and every epoch decodes the whole image); downscale it or remove it"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked here
            im_open = Image.open(p)
        with im_open as im:
            if im.width * im.height > max_pixels:
                return f"has {im.width} x {im.height} = {im.width * im.height:,} pixels, {too_big}"
            if im.format == "JPEG":
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
            im.load()
    except Image.DecompressionBombError as e:  # over Pillow's own limit: refused at open, before any decode
        n = re.search(r"\((\d+) pixels\)", str(e))
        return f"has {int(n[1]):,} pixels, {too_big}" if n else f"is too large ({e}), {too_big}"
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for damaged files
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"is not a readable image ({text})"
    return None


def check_images(paths: Sequence[str], where: str) -> None:
    """Scan every image of a split before training: a bad one is one line naming the file (and how many more)."""
    bad = [(f, why) for f in paths if (why := image_problem(f))]
    if bad:
        more = f" (and {len(bad) - 1} more bad image(s) in {where})" if len(bad) > 1 else ""
        raise ValueError(f"{bad[0][0]}: {bad[0][1]}; remove or replace it{more}")


class ImageFileReID(_MetaMixin, Dataset):
    """Images listed by path with their pid / camid / modality; decoded on access (in loader workers)."""

    def __init__(
        self,
        paths: Sequence[str],
        pids: Sequence[int] | np.ndarray,
        camids: Sequence[int] | np.ndarray,
        modalities: Sequence[str] | np.ndarray,
        image_size: tuple[int, int] = (128, 64),
        train: bool = False,
        relabel: bool | None = None,
    ) -> None:
        if not (len(paths) == len(pids) == len(camids) == len(modalities)):
            raise ValueError("ImageFileReID: paths, pids, camids and modalities must have the same length")
        self.paths = list(paths)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.train = train
        self._set_meta(pids, camids, modalities, relabel=train if relabel is None else relabel)
        self._mean = np.asarray(MEAN, dtype=np.float32)
        self._std = np.asarray(STD, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        img = (load_image(self.paths[i], self.image_size) - self._mean) / self._std
        x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        if self.train and torch.rand(()) < 0.5:  # horizontal flip; dataset-side RNG, in the worker
            x = x.flip(-1)
        return {"image": x, **self._meta_item(i)}


# The whole name: <pid>_c<camera>s<sequence>_<frame>_<box>.<ext>, pid -1 (junk) or 0000 (distractor) included;
# anchored so that a copy such as "0002_c1s1_000451_03 (1).jpg" is not read as a second image of person 2.
_MARKET_RE = re.compile(r"^(-?\d+)_c(\d+)s\d+_\d+_\d+\.[A-Za-z]+$")


def _scan_market(folder: Path) -> tuple[list[str], list[int], list[int]]:
    if not folder.is_dir():
        raise FileNotFoundError(
            f"Market-1501 folder {folder} not found; --data_path must hold bounding_box_train/, query/ and "
            f"bounding_box_test/ (the extracted Market-1501-v15.09.15 directory)"
        )
    paths, pids, cams = [], [], []
    bad: list[Path] = []
    for f in sorted(folder.iterdir()):
        if f.suffix.lower() not in IMG_EXTS:
            continue
        mt = _MARKET_RE.match(f.name)
        if mt is None:
            bad.append(f)
            continue
        pid, cam = int(mt.group(1)), int(mt.group(2))
        if pid <= 0:  # -1 = junk, 0000 = distractor: skipped
            continue
        paths.append(str(f))
        pids.append(pid)
        cams.append(cam)
    if bad:
        more = f" (and {len(bad) - 1} more such name(s) in {folder})" if len(bad) > 1 else ""
        raise ValueError(
            f"{bad[0]}: not a Market-1501 file name (expected <pid>_c<cam>s<seq>_<frame>_<box>.jpg, e.g. "
            f"0002_c1s1_000451_03.jpg); rename or remove it{more}"
        )
    if not paths:
        raise ValueError(f"{folder}: no Market-1501 images (0002_c1s1_000451_03.jpg style) found")
    return paths, pids, cams


def _check_fraction(val_fraction: float, what: str) -> None:
    if isinstance(val_fraction, bool) or not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r} ({what}): must be in [0, 1); 0 = no validation identities")


def _holdout_ids(pids: np.ndarray, val_fraction: float, seed: int, where: str) -> np.ndarray:
    """A seeded random round(val_fraction * ids) (at least 1) of the identities in `pids`."""
    ids = np.unique(pids)
    if val_fraction <= 0:
        return ids[:0]
    n_val = max(1, int(round(val_fraction * len(ids))))
    if len(ids) - n_val < 2:
        raise ValueError(
            f"{where}: val_fraction={val_fraction} holds out {n_val} of {len(ids)} training identities, "
            f"leaving fewer than 2 to train on; lower val_fraction (0 = no validation set)"
        )
    return np.sort(np.random.default_rng([seed, 0x7A1]).choice(ids, n_val, replace=False))


def single_query_protocol(ds: _MetaMixin, seed: int = 0) -> Protocols:
    """Market-style protocol on one set of images: one random query per (identity, camera), the rest is
    the gallery (same-identity same-camera matches are excluded by the metric, so a query is matched
    only across cameras)."""
    everyone = np.arange(len(ds.pids))
    q = _single_shot(ds, everyone, [seed, 0x9E7])
    return {"": (q, np.setdiff1d(everyone, q))}


def read_market1501(
    root: str | os.PathLike, image_size: tuple[int, int] = (128, 64), val_fraction: float = 0.1, seed: int = 0
) -> tuple[ImageFileReID, ReIDEvalSet | None, ReIDEvalSet]:
    """(train, val, test). All images are RGB. test = query -> bounding_box_test (protocol "").

    val: a seeded `val_fraction` of the bounding_box_train identities, held out from training, scored
    with one random query per (identity, camera) against the rest of their images; 0 = no val set.
    """
    _check_fraction(val_fraction, "Market-1501: share of the training identities held out for validation")
    root = Path(root)
    tr = _scan_market(root / "bounding_box_train")
    q = _scan_market(root / "query")
    g = _scan_market(root / "bounding_box_test")
    for split, files in (("bounding_box_train", tr), ("query", q), ("bounding_box_test", g)):
        check_images(files[0], str(root / split))  # every split before training, not the test images at the end
    tr_pids = np.asarray(tr[1])
    val_ids = _holdout_ids(tr_pids, val_fraction, seed, f"Market-1501 {root}")
    is_val = np.isin(tr_pids, val_ids)
    pick = [np.flatnonzero(~is_val), np.flatnonzero(is_val)]
    train, val_ds = (
        ImageFileReID(
            [tr[0][i] for i in ix],
            tr_pids[ix],
            np.asarray(tr[2])[ix],
            ["rgb"] * len(ix),
            image_size,
            train=k == 0,
        )  # fmt: skip
        for k, ix in enumerate(pick)
    )
    test = ImageFileReID(q[0] + g[0], q[1] + g[1], q[2] + g[2], ["rgb"] * (len(q[0]) + len(g[0])), image_size)
    nq = len(q[0])
    val = ReIDEvalSet(val_ds, single_query_protocol(val_ds, seed)) if len(val_ids) else None
    test_set = ReIDEvalSet(test, {"": (np.arange(nq), np.arange(nq, len(test)))})
    if val is not None:
        check_eval_set(
            val,
            f"{root / 'bounding_box_train'} (validation: the {len(val_ids)} identities val_fraction={val_fraction} "
            "holds out)",
            "raise val_fraction (--val_fraction) so that it holds out identities seen by two cameras, "
            "or set it to 0 for no validation set",
        )
    check_eval_set(
        test_set,
        f"{root} (test: query/ against bounding_box_test/)",
        "query/ and bounding_box_test/ must hold images of the same identities (the extracted Market-1501 folders)",
    )
    return train, val, test_set


def _read_id_list(path: Path) -> list[int]:
    if not path.is_file():
        raise FileNotFoundError(
            f"SYSU-MM01 id list {path} not found; expected exp/train_id.txt, exp/val_id.txt, exp/test_id.txt"
        )
    try:
        tokens = [t for t in re.split(r"[,\s]+", path.read_text(encoding="utf-8").strip()) if t]
        return [int(t) for t in tokens]
    except (UnicodeDecodeError, ValueError):
        raise ValueError(
            f"{path}: not a list of identity numbers (e.g. 1,2,4,...); restore the dataset's file"
        ) from None


def _scan_sysu(root: Path, ids: Sequence[int]) -> tuple[list[str], list[int], list[int], list[str]]:
    paths, pids, cams, mods = [], [], [], []
    for cam in SYSU_RGB_CAMS + SYSU_IR_CAMS:
        cam_dir = root / f"cam{cam}"
        if not cam_dir.is_dir():
            raise FileNotFoundError(f"SYSU-MM01 folder {cam_dir} not found; --data_path must hold cam1..cam6/ and exp/")
        mod = "rgb" if cam in SYSU_RGB_CAMS else "ir"
        for pid in ids:
            d = cam_dir / f"{pid:04d}"
            if not d.is_dir():
                continue  # not every identity is seen by every camera
            for f in sorted(d.iterdir()):
                if f.suffix.lower() in IMG_EXTS:
                    paths.append(str(f))
                    pids.append(pid)
                    cams.append(cam)
                    mods.append(mod)
    return paths, pids, cams, mods


def read_sysu_mm01(
    root: str | os.PathLike,
    image_size: tuple[int, int] = (128, 64),
    trials: int = 10,
    seed: int = 0,
    hold_out_val_ids: bool = True,
) -> tuple[ImageFileReID, ReIDEvalSet | None, ReIDEvalSet]:
    """(train, val, test) with the standard SYSU-MM01 protocol (`sysu_protocols`) on val and test.

    train = exp/train_id.txt identities; val = exp/val_id.txt identities (held out, they choose best.pt);
    test = exp/test_id.txt identities. hold_out_val_ids=False trains on train + val ids (395, as most
    papers do) and returns val None.
    """
    root = Path(root)
    train_ids = _read_id_list(root / "exp" / "train_id.txt")
    val_ids = _read_id_list(root / "exp" / "val_id.txt")
    test_ids = _read_id_list(root / "exp" / "test_id.txt")
    if not hold_out_val_ids:
        train_ids, val_ids = train_ids + val_ids, []
    tr = _scan_sysu(root, train_ids)
    te = _scan_sysu(root, test_ids)
    if not tr[0] or not te[0]:
        raise ValueError(f"{root}: no SYSU-MM01 images found under cam1..cam6/<pid>/ for the listed ids")
    va = _scan_sysu(root, val_ids) if val_ids else ([], [], [], [])
    for split, files in (("train", tr), ("val", va), ("test", te)):
        check_images(files[0], f"{root} ({split} identities)")  # every split before training
    train = ImageFileReID(*tr, image_size=image_size, train=True)
    test = ImageFileReID(*te, image_size=image_size)
    ranks = (1, 10, 20)  # what SYSU-MM01 papers report, beside mAP
    val = None
    if val_ids:
        if not va[0]:
            raise ValueError(
                f"{root}: exp/val_id.txt lists {len(val_ids)} validation identities but cam1..cam6/<pid>/ hold no "
                "image of them; restore the images, or pass --val_fraction 0 to train without validation"
            )
        val_ds = ImageFileReID(*va, image_size=image_size)
        val = ReIDEvalSet(val_ds, sysu_protocols(val_ds, trials, seed), SYSU_EXCLUDED_CAMERA_PAIRS, ranks)
        check_eval_set(
            val,
            f"{root} (validation: exp/val_id.txt identities)",
            "each identity needs IR images (cam3, cam6) and RGB images (cam1, 2, 4, 5); restore the images, or "
            "pass --val_fraction 0 to train without validation",
        )
    test_set = ReIDEvalSet(test, sysu_protocols(test, trials, seed), SYSU_EXCLUDED_CAMERA_PAIRS, ranks)
    check_eval_set(
        test_set,
        f"{root} (test: exp/test_id.txt identities)",
        "each identity needs IR images (cam3, cam6) and RGB images (cam1, 2, 4, 5); restore the images",
    )
    return train, val, test_set


def sysu_protocols(ds: _MetaMixin, trials: int = 10, seed: int = 0) -> Protocols:
    """SYSU-MM01's evaluation (Wu et al., ICCV 2017): IR queries (cams 3, 6) against a single-shot RGB
    gallery of one random image per (identity, camera), drawn `trials` times (trial t seeded by seed + t);
    "allsearch" draws from RGB cams 1, 2, 4, 5 (outdoor and indoor), "indoor" from cams 1, 2. Together with
    SYSU_EXCLUDED_CAMERA_PAIRS (cam2 gallery images are not matched against cam3 queries) and mean/std over
    the trials in utils/reid_eval.py, this is the standard protocol, comparable with published figures.
    """
    if trials < 1:
        raise ValueError(f"trials={trials}: SYSU-MM01 needs at least 1 gallery draw (the standard is 10)")
    q = np.flatnonzero(np.isin(ds.camids, SYSU_IR_CAMS))
    out: Protocols = {}
    for name, cams in (("allsearch", SYSU_RGB_CAMS), ("indoor", (1, 2))):
        pool = np.flatnonzero(np.isin(ds.camids, cams))
        out[name] = (q, [_single_shot(ds, pool, seed + t) for t in range(trials)])
    return out


def _single_shot(ds: _MetaMixin, idx: np.ndarray, seed: int | Sequence[int]) -> np.ndarray:
    """One random sample of `idx` per (identity, camera)."""
    shuffled = idx[np.random.default_rng(seed).permutation(len(idx))]
    _, first = np.unique(ds.pids[shuffled] * 1000 + ds.camids[shuffled], return_index=True)
    return np.sort(shuffled[first])


# ----------------------------------------------------------------------------------------- evaluation set
@dataclass
class ReIDEvalSet(Dataset):
    """All images of an evaluation split in one dataset + named (query indices, gallery indices) protocols;
    a gallery may be a list of index arrays (random trials, scored as mean and std). Indexing it indexes its
    images."""

    dataset: ReIDImages
    protocols: Protocols
    excluded_camera_pairs: Sequence[tuple[int, int]] = field(default_factory=tuple)
    ranks: tuple[int, ...] = (1, 5, 10)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.dataset[i]


def eval_set_problem(ev: ReIDEvalSet) -> str | None:
    """Why an evaluation set cannot be scored (None: it can), found from its metadata before any training: an
    empty set, a protocol without queries or gallery, or one where no query has a true match (an image of its
    identity in the gallery from a camera the protocol does not exclude), which the metric would refuse."""
    pids, camids = np.asarray(ev.dataset.pids), np.asarray(ev.dataset.camids)
    if len(pids) == 0:
        return "holds no image"
    excluded = {(int(a), int(b)) for a, b in ev.excluded_camera_pairs}
    for name, (q, gi) in ev.protocols.items():
        label = f"protocol {name!r}" if name else "the query -> gallery protocol"
        q = np.asarray(q)
        trials = [np.asarray(gi)] if isinstance(gi, np.ndarray) else [np.asarray(g) for g in gi]
        if len(q) == 0:
            return f"{label} has no query image"
        if not trials or any(len(g) == 0 for g in trials):
            return f"{label} has an empty gallery"
        query_pairs = {(int(a), int(b)) for a, b in zip(pids[q], camids[q])}
        for t, g in enumerate(trials):
            gallery_cams: dict[int, set[int]] = {}
            for a, b in zip(pids[g].tolist(), camids[g].tolist()):
                gallery_cams.setdefault(a, set()).add(b)
            if not any(
                gc != qc and (qc, gc) not in excluded for qp, qc in query_pairs for gc in gallery_cams.get(qp, ())
            ):
                shared = len({qp for qp, _ in query_pairs} & set(gallery_cams))
                where = f" (gallery draw {t + 1} of {len(trials)})" if len(trials) > 1 else ""
                return (
                    f"{label}{where}: no query has a true match: the {len({qp for qp, _ in query_pairs})} query "
                    f"identities share {shared} with the gallery's {len(gallery_cams)}, and a match must come "
                    "from another camera"
                )
    return None


def check_eval_set(ev: ReIDEvalSet, where: str, how: str) -> None:
    """Refuse an evaluation set that cannot be scored when the data is read, not after training: one line
    naming `where` (the folder or split) and `how` to fix it."""
    why = eval_set_problem(ev)
    if why:
        raise ValueError(f"{where}: {why}; {how}")


def cross_modality_protocols(ds: _MetaMixin, single_shot: bool = False, seed: int = 0) -> Protocols:
    """{"rgb2ir": (rgb, ir), "ir2rgb": (ir, rgb)}; single_shot keeps one gallery image per (pid, cam)."""
    rgb = np.flatnonzero(ds.modalities == "rgb")
    ir = np.flatnonzero(ds.modalities != "rgb")

    def gallery(idx: np.ndarray) -> np.ndarray:
        return _single_shot(ds, idx, seed) if single_shot else idx

    return {"rgb2ir": (rgb, gallery(ir)), "ir2rgb": (ir, gallery(rgb))}


# ------------------------------------------------------------------------------------------ synthetic set
class SyntheticCrossModalReID(_MetaMixin, Dataset):
    """Synthetic cross-modality re-ID: built-in sample data for the demo and the tests.

    Each identity has a signature: upper- and lower-body colours, a stripe texture (frequency, orientation,
    phase) on the upper body, a lower-body pattern (plain, checks, stripes), a logo patch at an
    identity-specific position and a bag on one side (or none) of identity-specific length. RGB images render the
    colours; IR images render one intensity per body part (a fixed NIR-like mix of the colours, unlike
    luminance) replicated to 3 channels, so texture, layout and a colour-derived brightness carry across
    modalities but hue does not. Cameras: RGB 1, 2, 4, 5 and IR 3, 6 (as SYSU-MM01), each with its own
    gain, colour cast and offset; every sample adds pose jitter (shift), a random background, flips and
    noise. Images are generated once at construction (vectorised) and held as one float32 tensor.

    `id_offset` makes disjoint identity ranges for train and test; the same `seed` gives the same data.
    """

    def __init__(
        self,
        num_identities: int = 64,
        samples_per_id: int = 16,
        ir_fraction: float = 0.375,
        image_size: tuple[int, int] = (64, 32),
        seed: int = 0,
        id_offset: int = 0,
        relabel: bool = True,
        noise: float = 0.08,
    ) -> None:
        if num_identities < 1 or samples_per_id < 2:
            raise ValueError(f"num_identities={num_identities} must be >= 1 and samples_per_id={samples_per_id} >= 2")
        if not 0.0 < ir_fraction < 1.0:
            raise ValueError(
                f"ir_fraction={ir_fraction} must be in (0, 1) so that every identity has RGB and IR samples"
            )
        H, W = int(image_size[0]), int(image_size[1])
        if H < 16 or W < 8:
            raise ValueError(f"image_size={image_size}: synthetic images need H >= 16 and W >= 8")
        self.image_size = (H, W)
        n_ir = max(1, min(samples_per_id - 1, int(round(samples_per_id * ir_fraction))))
        n_rgb = samples_per_id - n_ir
        N = num_identities * samples_per_id
        # identity signatures depend on (seed, pid) only, so train/test sets share nothing but the recipe
        pids = np.repeat(np.arange(num_identities) + id_offset, samples_per_id)
        is_ir = np.tile(np.r_[np.zeros(n_rgb, bool), np.ones(n_ir, bool)], num_identities)
        sig = np.stack([self._signature(seed, int(p)) for p in np.arange(num_identities) + id_offset])
        sig = sig[np.repeat(np.arange(num_identities), samples_per_id)]
        rng = np.random.default_rng([seed, id_offset, num_identities, 7])
        cams = np.where(is_ir, rng.choice(SYSU_IR_CAMS, N), rng.choice(SYSU_RGB_CAMS, N))
        imgs = self._render(sig, is_ir, cams, rng, H, W, noise)
        self.images = torch.from_numpy(imgs)
        self._set_meta(pids, cams, np.where(is_ir, "ir", "rgb"), relabel=relabel)
        self.num_identities = num_identities

    @staticmethod
    def _signature(seed: int, pid: int) -> np.ndarray:
        r = np.random.default_rng([seed, pid, 11])
        up, low = r.random(3), r.random(3)
        freq = r.integers(0, 5)  # 0 = plain
        orient = r.integers(0, 3)  # horizontal, vertical, diagonal stripes
        phase = r.random()
        logo_y, logo_x = r.random(), r.random()
        logo_on = r.random() < 0.7
        low_pattern = r.integers(0, 4)  # plain, checks, horizontal or vertical stripes
        bag_side = r.integers(0, 3)  # none, left, right
        bag_len = r.random()
        return np.r_[up, low, freq, orient, phase, logo_y, logo_x, logo_on, low_pattern, bag_side, bag_len].astype(
            np.float64
        )

    @staticmethod
    def _render(
        sig: np.ndarray,
        is_ir: np.ndarray,
        cams: np.ndarray,
        rng: np.random.Generator,
        H: int,
        W: int,
        noise: float,
    ) -> np.ndarray:
        N = len(sig)
        yy, xx = np.meshgrid(np.arange(H) / H, np.arange(W) / W, indexing="ij")  # (H, W) in [0, 1)
        dy = rng.uniform(-0.06, 0.06, N)[:, None, None]  # pose / detection jitter
        dx = rng.uniform(-0.08, 0.08, N)[:, None, None]
        y, x = yy[None] - dy, xx[None] - dx
        body = (x > 0.22) & (x < 0.78) & (y > 0.12) & (y < 0.95)
        head = ((x - 0.5) ** 2 / 0.02 + (y - 0.07) ** 2 / 0.004) < 1
        upper = body & (y < 0.52)
        lower = body & ~upper
        freq, orient, phase = sig[:, 6], sig[:, 7], sig[:, 8]
        coord = np.where(orient[:, None, None] == 0, y, np.where(orient[:, None, None] == 1, x, (x + y) / 2))
        stripes = np.where(
            freq[:, None, None] > 0,
            0.5 + 0.5 * np.sign(np.sin(2 * math.pi * (coord * freq[:, None, None] * 3 + phase[:, None, None]))),
            1.0,
        )
        tex_up = 0.55 + 0.45 * stripes  # stripes modulate brightness: survives the IR rendering
        check = (np.floor(x * 8) + np.floor(y * 8)) % 2
        pat = sig[:, 11, None, None]
        hstr = (np.floor(y * 12) % 2) * 1.0
        vstr = (np.floor(x * 8) % 2) * 1.0
        tex_low = np.where(
            pat == 1,
            0.6 + 0.4 * check,
            np.where(pat == 2, 0.6 + 0.4 * hstr, np.where(pat == 3, 0.6 + 0.4 * vstr, 1.0)),
        )
        side, blen = sig[:, 13, None, None], sig[:, 14, None, None]
        bag_x = np.where(side == 1, (x > 0.1) & (x < 0.24), (x > 0.76) & (x < 0.9)) & (side > 0)
        bag = bag_x & (y > 0.3) & (y < 0.4 + 0.4 * blen)
        ly, lx = 0.2 + 0.25 * sig[:, 9, None, None], 0.3 + 0.4 * sig[:, 10, None, None]
        logo = (np.abs(y - ly) < 0.07) & (np.abs(x - lx) < 0.1) & (sig[:, 12, None, None] > 0.5)
        up_c, low_c = sig[:, 0:3], sig[:, 3:6]
        bg = rng.random((N, 3)) * 0.6
        img = np.empty((N, H, W, 3), dtype=np.float64)
        for c in range(3):
            ch = bg[:, c, None, None] * (0.8 + 0.2 * np.sin(6 * x + 3 * y + bg[:, c, None, None] * 6))
            ch = np.where(upper, up_c[:, c, None, None] * tex_up, ch)
            ch = np.where(lower, low_c[:, c, None, None] * tex_low, ch)
            ch = np.where(head, 0.75, ch)
            ch = np.where(logo, 1.0 - up_c[:, c, None, None], ch)
            ch = np.where(bag, 0.12, ch)
            img[..., c] = ch
        # IR: an NIR-like mix (not luminance), warmer skin, cooler background -> single channel x 3
        nir_w = np.array([0.5, 0.15, 0.35])
        ir = img @ nir_w
        ir = np.where(head, 0.95, np.where(body | logo | bag, ir, ir * 0.5))
        img = np.where(is_ir[:, None, None, None], ir[..., None], img)
        # camera: gain, colour cast (RGB cameras only), then sensor noise; random horizontal flip
        cam_gain = {1: 1.0, 2: 0.92, 3: 1.05, 4: 1.08, 5: 0.95, 6: 0.9}
        cam_cast = {
            1: (1.0, 1.0, 1.0),
            2: (1.1, 1.0, 0.9),
            4: (0.9, 1.0, 1.1),
            5: (1.0, 1.1, 0.95),
            3: (1.0, 1.0, 1.0),
            6: (1.0, 1.0, 1.0),
        }
        gain = np.array([cam_gain[int(c)] for c in cams]) * rng.uniform(0.92, 1.08, N)
        cast = np.array([cam_cast[int(c)] for c in cams])
        img = img * gain[:, None, None, None] * cast[:, None, None, :]
        eps = rng.normal(0.0, noise, img.shape)
        img = img + np.where(is_ir[:, None, None, None], eps[..., :1], eps)  # IR sensor: one channel
        flip = rng.random(N) < 0.5
        img[flip] = img[flip, :, ::-1]
        img = np.clip(img, 0.0, 1.0)
        img = (img - np.array(MEAN)) / np.array(STD)
        return np.ascontiguousarray(img.transpose(0, 3, 1, 2), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.pids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[i], **self._meta_item(i)}

    # device residency protocol of trainer/data.py: the whole set is a few MB
    def maybe_to_device(self, device: torch.device) -> bool:
        self.images = self.images.to(device)
        self._meta_t = self._meta_tensors(device)
        return True

    def _meta_tensors(self, device: torch.device | None = None) -> dict[str, torch.Tensor]:
        meta = {"label": self.labels, "pid": self.pids, "camid": self.camids, "is_ir": self.is_ir}
        return {k: torch.as_tensor(v, device=device) for k, v in meta.items()}

    def gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        meta = getattr(self, "_meta_t", None)
        if meta is None:
            meta = self._meta_t = self._meta_tensors()
        return {"image": self.images[idx], **{k: v[idx] for k, v in meta.items()}}


def synthetic_reid(
    num_identities: int = 64,
    num_test_identities: int | None = None,
    samples_per_id: int = 16,
    image_size: tuple[int, int] = (64, 32),
    seed: int = 0,
    num_val_identities: int = 0,
) -> tuple[SyntheticCrossModalReID, ReIDEvalSet | None, ReIDEvalSet]:
    """(train, val, test) over three disjoint identity ranges, each eval set with "rgb2ir" and "ir2rgb"
    protocols (multi-shot: every image of the other modality is in the gallery). val is None when
    num_val_identities is 0. Test identities default to half the training ones, between 8 and 64."""
    n_test = num_test_identities if num_test_identities is not None else max(8, min(64, num_identities // 2))
    train = SyntheticCrossModalReID(num_identities, samples_per_id, image_size=image_size, seed=seed)

    def held_out(n: int, offset: int) -> ReIDEvalSet:
        ds = SyntheticCrossModalReID(n, samples_per_id, image_size=image_size, seed=seed, id_offset=offset,
                                     relabel=False)  # fmt: skip
        return ReIDEvalSet(ds, cross_modality_protocols(ds))

    val = held_out(num_val_identities, 20_000) if num_val_identities > 0 else None
    return train, val, held_out(n_test, 10_000)

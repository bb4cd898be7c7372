"""trainer/checkpoint.py: digests, corruption vs pickle payloads, old checkpoints, orphan temp files."""

from __future__ import annotations

import io
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import cut_short
from trainer.checkpoint import (
    DIGEST_KEY,
    INTEGRITY_KEY,
    UNVERIFIED,
    CheckpointError,
    atomic_save,
    load_checkpoint,
    remove_orphan_temps,
    state_digest,
)
from trainer.support.files import _owner_tag

ROOT = Path(__file__).resolve().parents[1]
MARKER = 0.0091  # the weight that became 3.1e36 after one flipped bit in issue 10


def make_ckpt() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "step": 40,
        "best": {"rmse": 0.25, "nan": float("nan")},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "config": {"lr": 1e-3, "lon": [-180, 180], "name": "ré"},
        "marker": torch.full((2048,), MARKER),
        "format": "plainloop-1",
    }


def assert_same(a, b) -> None:
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_round_trip_is_verified_and_exact(tmp_path):
    ck = make_ckpt()
    path = atomic_save(ck, tmp_path / "last.pt")
    raw = torch.load(path, weights_only=True)
    assert raw[DIGEST_KEY].startswith("sha256:") and len(raw[DIGEST_KEY]) == 7 + 64
    got = load_checkpoint(path)
    assert got.pop(INTEGRITY_KEY) == "verified" and DIGEST_KEY not in got
    assert_same(ck, got)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_run_directory_resolves_to_last_pt(tmp_path):
    atomic_save(make_ckpt(), tmp_path / "run" / "checkpoints" / "last.pt")
    assert load_checkpoint(tmp_path / "run")["step"] == 40


def test_one_flipped_bit_in_a_weight_is_reported_as_corruption(tmp_path):
    path = atomic_save(make_ckpt(), tmp_path / "last.pt")
    data = bytearray(path.read_bytes())
    at = data.find(np.float32(MARKER).tobytes() * 4)
    assert at > 0
    data[at + 3] ^= 0x40  # exponent bit: 0.0091 becomes ~3e36, as in issue 10
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["marker"][0] > 1e30  # torch alone loads it silently
    with pytest.raises(CheckpointError, match=r"last\.pt is corrupt: its contents do not match the digest"):
        load_checkpoint(path)


def test_every_sampled_bit_flip_is_caught_or_harmless(tmp_path):
    """A flip anywhere in the file either is reported as corrupt or leaves the loaded contents unchanged."""
    ck = make_ckpt()
    path = atomic_save(ck, tmp_path / "ck.pt")
    clean = path.read_bytes()
    rng = random.Random(0)
    positions = rng.sample(range(len(clean)), 150) + list(range(0, 64)) + list(range(len(clean) - 64, len(clean)))
    caught = harmless = 0
    for pos in positions:
        data = bytearray(clean)
        data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        try:
            got = load_checkpoint(path)
        except CheckpointError as e:
            assert "ck.pt" in str(e) and "corrupt" in str(e) and "pickled" not in str(e), (pos, str(e))
            caught += 1
            continue
        got.pop(INTEGRITY_KEY)
        assert_same(ck, got)  # never silently different
        harmless += 1
    assert caught > 100 and caught + harmless == len(positions)


@pytest.mark.parametrize(
    "content",
    [
        os.urandom(4096),
        b"not a checkpoint\n" * 40,
        b"",
        b"\x80\x04" + os.urandom(512),
        b"PK\x03\x04" + os.urandom(600),
    ],
)
def test_damaged_bytes_are_corrupt_not_pickled_objects(tmp_path, content):
    path = tmp_path / "last.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert "is corrupt" in msg and str(path) in msg and "pickled" not in msg
    assert "\n" not in msg  # one line


def test_truncated_checkpoint_is_corrupt(tmp_path):
    path = atomic_save(make_ckpt(), tmp_path / "last.pt")
    whole = path.read_bytes()
    for n in (10, len(whole) // 2, len(whole) - 30):
        path.write_bytes(whole[:n])
        with pytest.raises(CheckpointError, match="corrupt or truncated") as e:
            load_checkpoint(path)
        # torch's reason in whole sentences: its zip reader's advice was cut off mid-sentence ("... checkpoint file is")
        reason = str(e.value).split("cannot be read (", 1)[1].rsplit("); use another", 1)[0]
        assert reason.endswith((".", "...")) or len(reason) < 150, reason


class Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("form", ["zip", "legacy", "raw pickle"])
def test_pickle_payloads_are_refused_and_never_run(tmp_path, form):
    marker = tmp_path / "pwned"
    obj = {"model": {"w": torch.ones(2)}, "payload": Payload(str(marker))}
    path = tmp_path / "evil.pt"
    if form == "zip":
        torch.save(obj, path)
    elif form == "legacy":
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(obj))
    with pytest.raises(CheckpointError, match=r"weights_only=True \(it holds pickled Python objects") as e:
        load_checkpoint(path)
    assert "evil.pt" in str(e.value)
    assert not marker.exists()


def test_checkpoint_without_digest_still_loads_marked_unverified(tmp_path):
    ck = make_ckpt()
    torch.save(ck, tmp_path / "old.pt")  # what plainloop wrote before digests
    got = load_checkpoint(tmp_path / "old.pt")
    assert got.pop(INTEGRITY_KEY) == UNVERIFIED
    assert_same(ck, got)


def test_plain_state_dict_gets_no_digest(tmp_path):
    model = torch.nn.Linear(3, 2)
    atomic_save(model.state_dict(), tmp_path / "w.pt")
    state = torch.load(tmp_path / "w.pt", weights_only=True)
    assert DIGEST_KEY not in state
    torch.nn.Linear(3, 2).load_state_dict(state)  # strict: an extra key would fail here
    atomic_save({"w": torch.ones(1)}, tmp_path / "forced.pt", digest=True)
    assert DIGEST_KEY in torch.load(tmp_path / "forced.pt", weights_only=True)


def test_digest_covers_dtype_shape_values_and_entries():
    base = {"model": {"w": torch.arange(6, dtype=torch.float32)}, "step": 1}
    d0 = state_digest(base)
    variants = [
        {
            "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
            "step": 1,
        },  # same bytes, new shape
        {
            "model": {"w": torch.arange(6, dtype=torch.float32).view(torch.int32)},
            "step": 1,
        },  # same bytes, dtype
        {"model": {"w": torch.arange(6, dtype=torch.float32) + 1e-7}, "step": 1},
        {"model": {"w": torch.arange(6, dtype=torch.float32)}, "step": 2},
        {"model": {"w": torch.arange(6, dtype=torch.float32)}, "step": True},
        {"model": {"v": torch.arange(6, dtype=torch.float32)}, "step": 1},
        {"model": {"w": torch.arange(6, dtype=torch.float32)}, "step": 1, "extra": None},
    ]
    assert len({d0, *map(state_digest, variants)}) == len(variants) + 1
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()[:, :2]  # a non-contiguous view
    assert state_digest({"w": strided}) == state_digest({"w": strided.contiguous()})
    assert state_digest({"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}) != state_digest(
        {"w": torch.tensor([1.0, 2.5], dtype=torch.bfloat16)}
    )


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_digest_of_quantized_tensors_covers_their_integers_and_scales(tmp_path):
    """A model with quantized tensors checkpoints: their integers, scales and zero points are hashed (hashing
    their values failed, and the save with it), and the file round-trips verified."""
    x = torch.tensor([0.1, 0.2, 0.3])
    per_tensor = [torch.quantize_per_tensor(x, s, z, torch.qint8) for s, z in ((0.1, 0), (0.05, 0), (0.1, 1))]
    per_channel = torch.quantize_per_channel(
        torch.ones(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 0, torch.qint8
    )
    digests = {state_digest({"q": q}) for q in [*per_tensor, per_channel, per_tensor[0].int_repr()]}
    assert len(digests) == 5  # each scale, zero point and scheme counts; the integers alone are not the same
    atomic_save({"model": {"q": per_tensor[0], "c": per_channel}, "step": 3}, tmp_path / "q.pt")
    back = load_checkpoint(tmp_path / "q.pt")
    assert torch.equal(back["model"]["q"].int_repr(), per_tensor[0].int_repr()) and back["step"] == 3


# --------------------------------------------------------------------------------------------- orphans


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_remove_orphan_temps_keeps_live_writers_and_other_files(tmp_path):
    host = _owner_tag().split("~")[0]
    # alive until the test kills it (however slow the test): its temp file is a live writer's
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        names = {
            "dead": f".last.pt.{host}~{dead_pid()}.k2j4_x9.tmp",
            "live": f".last.pt.{host}~{sleeper.pid}.a1b2c3d4.tmp",
            "me": f".best.pt.{host}~{os.getpid()}.zz.tmp",
            "other_host_fresh": f".last.pt.elsewhere-node7~{dead_pid()}.abc.tmp",
            "other_host_old": ".last.pt.elsewhere-node7~1.abc.tmp",
            "no_owner_fresh": ".last.pt.abcd1234.tmp",
            "no_owner_old": ".last.pt.efgh5678.tmp",
            "json_old": ".summary.json.tmp",
            "not_ours_1": "last.pt",
            "not_ours_2": ".era5_abc.tmp.npy",
            "not_ours_3": "notes.tmp",
        }
        for n in names.values():
            (tmp_path / n).write_bytes(b"x")
        old = time.time() - 3600
        for k in ("other_host_old", "no_owner_old", "json_old", "not_ours_1", "not_ours_2", "not_ours_3"):
            os.utime(tmp_path / names[k], (old, old))
        removed = remove_orphan_temps(tmp_path, max_age_s=900)
        assert sorted(p.name for p in removed) == sorted(
            names[k] for k in ("dead", "other_host_old", "no_owner_old", "json_old")
        )
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {
            names[k]
            for k in (
                "live",
                "me",
                "other_host_fresh",
                "no_owner_fresh",
                "not_ours_1",
                "not_ours_2",
                "not_ours_3",
            )
        }
    finally:
        sleeper.kill()
        sleeper.wait()
    assert remove_orphan_temps(tmp_path / "missing") == []


KILLED_WRITER = """
import sys, torch
sys.path.insert(0, {root!r})
from trainer.checkpoint import atomic_save
real_save = torch.save
def slow_save(obj, f):
    f.write(b"PK partial")
    f.flush()
    print("writing", flush=True)
    sys.stdin.read()  # mid-write until the test kills it
torch.save = slow_save
atomic_save({{"model": {{"w": torch.ones(3)}}}}, {path!r})
"""


def test_a_writer_killed_mid_write_leaves_a_temp_that_is_removed(tmp_path):
    ckdir = tmp_path / "checkpoints"
    atomic_save({"model": {"w": torch.zeros(3)}}, ckdir / "last.pt")
    code = KILLED_WRITER.format(root=str(ROOT), path=str(ckdir / "last.pt"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        temps = [p for p in ckdir.iterdir() if p.name != "last.pt"]
        assert len(temps) == 1 and f"~{proc.pid}." in temps[0].name
        assert remove_orphan_temps(ckdir) == []  # the writer is alive: its temp stays
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert remove_orphan_temps(ckdir) == temps
    assert [p.name for p in ckdir.iterdir()] == ["last.pt"]
    assert torch.equal(load_checkpoint(ckdir / "last.pt")["model"]["w"], torch.zeros(3))  # old file intact


def test_owner_tag_names_this_host_and_process():
    tag = _owner_tag()
    assert tag.endswith(f"~{os.getpid()}") and "." not in tag
    assert tag.split("~")[0] in socket.gethostname().replace(".", "-")


def test_digest_does_not_change_what_torch_load_returns(tmp_path):
    """A digest-bearing file still loads with plain torch.load (for people who do not use plainloop)."""
    atomic_save(make_ckpt(), tmp_path / "ck.pt")
    buf = io.BytesIO((tmp_path / "ck.pt").read_bytes())
    assert set(torch.load(buf, weights_only=True)) >= {"model", "optimizer", DIGEST_KEY}


def test_a_plainloop_1_checkpoint_still_resumes(tmp_path):
    """The first format: the scaler at the top level, no opt_step, world_size, val_pending or callbacks, `best` a
    bare number, no digest. It resumes, and the run ends with the weights of an uninterrupted one."""
    from tests.helpers import toy_config
    from tests.test_engine import make_task, weights
    from trainer import Trainer

    straight = Trainer(toy_config(tmp_path, run_name="straight"), make_task())
    straight.fit()
    first = Trainer(toy_config(tmp_path, run_name="old"), make_task())
    cut_short(first, max_epochs=1)
    first.fit()
    path = tmp_path / "old" / "checkpoints" / "last.pt"
    ck = load_checkpoint(path)
    old = {k: ck[k] for k in ("model", "optimizer", "scheduler", "epoch", "step", "batches_done", "sampler", "rng")}
    old.update(scaler=ck["opt_step"]["scaler"], best=ck["best"]["best"], config=ck["config"], task="toy")
    old["format"] = "plainloop-1"
    atomic_save(old, path, digest=False)
    rest = Trainer(toy_config(tmp_path, run_name="old", resume=str(tmp_path / "old")), make_task())
    assert any("unverified" in n for n in rest.notes) and rest.step == 8
    assert rest.fit()["steps"] == 16
    for p, q in zip(weights(straight.raw_model), weights(rest.raw_model)):
        assert torch.equal(p, q)

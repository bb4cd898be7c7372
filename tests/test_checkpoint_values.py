"""What callbacks and models put in a checkpoint: what saves, resumes (NumPy arrays and scalars come back as they were),
and what cannot is refused at the first save, naming its key, with no file written (issue 39)."""

from __future__ import annotations

import collections
import threading

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.helpers import toy_config
from trainer import Task, Trainer
from trainer.checkpoint import CheckpointError, NotStorable, load_checkpoint, restore, storable

pytestmark = pytest.mark.usefixtures("one_thread")


def data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


VALUES = {
    "array": np.arange(12, dtype=np.float32).reshape(3, 4),
    "scalar": np.float64(2.5),
    "int_scalar": np.int64(-7),
    "bool_scalar": np.bool_(True),
    "nested": {"stats": [np.zeros((2, 0), np.int16), {"mean": np.array([1.5, -2.0])}], "n": 3},
    "tuple": (np.uint32(4), "a", None, 1.0),
    "strings": np.array(["ab", "c"]),
    "big_endian": np.array([1.0, 2.0], dtype=">f4"),
    "dates": np.array(["2020-01-01"], dtype="datetime64[D]"),
    "zero_d": np.array(3.0),
}


def same(a, b):
    if isinstance(a, np.ndarray | np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_numpy_values_round_trip_with_dtype_shape_and_container_types():
    stored = storable(VALUES)
    assert same(restore(stored), VALUES)
    plain = {"w": torch.ones(2), "n": [1, 2.0, "x", None, (True,)]}
    assert storable(plain) is plain  # nothing to convert: the same object, no copy


class Keeper:
    """A callback whose state holds NumPy values (running statistics, a replay buffer)."""

    def __init__(self):
        self.state = {}
        self.loaded = None

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


@pytest.mark.parametrize("kind", ["array", "scalar", "nested", "tuple"])
def test_a_callback_state_with_numpy_values_resumes(tmp_path, kind):
    keep = Keeper()
    keep.state = {kind: VALUES[kind]}
    Trainer(
        toy_config(tmp_path, epochs=1), Task("t", nn.Linear(4, 1), data()), callbacks=[keep], log=lambda s: None
    ).fit()
    back = Keeper()
    t = Trainer(toy_config(tmp_path, epochs=2, resume=str(tmp_path / "run")), Task("t", nn.Linear(4, 1), data()),
                callbacks=[back], log=lambda s: None)  # fmt: skip
    assert same(back.loaded, {kind: VALUES[kind]})
    t.fit()


class Replay(L.LightningModule):
    """Lightning's habit: running statistics and a replay buffer stored by on_save_checkpoint."""

    def __init__(self, extra=None):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.buffer = np.arange(10, dtype=np.float32)
        self.extra = extra
        self.restored = None

    def training_step(self, batch, batch_idx):
        self.buffer = self.buffer + 1
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_save_checkpoint(self, checkpoint):
        checkpoint["replay"] = {"buffer": self.buffer, "count": np.int64(len(self.buffer))}
        if self.extra is not None:
            checkpoint["extra"] = self.extra

    def on_load_checkpoint(self, checkpoint):
        self.restored = checkpoint["replay"]


def test_a_lightning_module_that_stores_numpy_in_on_save_checkpoint_resumes(tmp_path):
    a = Replay()
    Trainer(toy_config(tmp_path, epochs=1), Task("r", a, data()), log=lambda s: None).fit()
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt["integrity"] == "verified" and same(ckpt["replay"]["buffer"], a.buffer)
    b = Replay()
    Trainer(toy_config(tmp_path, epochs=2, resume=str(tmp_path / "run")), Task("r", b, data()), log=lambda s: None)
    assert same(b.restored, {"buffer": a.buffer, "count": np.int64(10)})


def lock_holder():
    return threading.Lock()


@pytest.mark.parametrize(
    ("value", "where", "why"),
    [
        ({"buf": [1, 2, 3, {4}]}, "checkpoint['extra']['buf'][3]", "a set is not storable"),
        ({"fn": lambda x: x}, "checkpoint['extra']['fn']", "a function is not storable"),
        ([collections.OrderedDict(a=1), threading.Lock()], "checkpoint['extra'][1]", "_thread.lock object"),
        ({"d": collections.defaultdict(list)}, "checkpoint['extra']['d']", "store it as a plain dict"),
        ({np.int64(3): 1}, "checkpoint['extra']", "the key np.int64(3) is of type int64; use str"),
        (np.array([object()]), "checkpoint['extra']", "dtype object"),
    ],
)
def test_what_cannot_load_back_is_refused_at_the_first_save_naming_its_key(tmp_path, value, where, why):
    t = Trainer(toy_config(tmp_path, epochs=1), Task("r", Replay(extra=value), data()), log=lambda s: None)
    with pytest.raises(NotStorable) as e:
        t.fit()
    msg = str(e.value)
    assert msg.startswith("refusing to write last.pt: " + where) and why in msg and "\n" not in msg, msg
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_a_refused_save_keeps_the_previous_checkpoint(tmp_path):
    """The bad value appears after a first good save: the save is refused, last.pt stays the good one."""

    class Later(Keeper):
        def on_train_epoch_end(self, trainer, epoch):
            if epoch == 1:
                self.state = {"buf": [np.zeros(2), Keeper()]}

    keep = Later()
    t = Trainer(toy_config(tmp_path, epochs=3), Task("t", nn.Linear(4, 1), data()), callbacks=[keep],
                log=lambda s: None)  # fmt: skip
    with pytest.raises(
        CheckpointError, match=r"callback '.*Later' state\['buf'\]\[1\]: a .*Keeper object is not storable"
    ):
        t.fit()
    assert load_checkpoint(tmp_path / "run")["epoch"] == 1  # the last good one, whole


def test_a_damaged_numpy_entry_is_one_line_naming_the_file(tmp_path):
    from trainer.checkpoint import NUMPY_KEY, atomic_save

    path = tmp_path / "x.pt"
    atomic_save({"model": {}, "v": {NUMPY_KEY: "<f4", "shape": [3], "data": torch.zeros(2)}}, path)
    with pytest.raises(CheckpointError, match="x.pt has a damaged NumPy entry"):
        load_checkpoint(path)
    atomic_save({"model": {}, "v": {NUMPY_KEY: "O", "shape": [1], "data": torch.zeros(8, dtype=torch.uint8)}}, path)
    with pytest.raises(CheckpointError, match="damaged NumPy entry"):
        load_checkpoint(path)

"""The checkpoint file: written atomically with a digest, loaded with weights_only=True.


- `atomic_save` writes a temp file in the same folder, fsyncs and renames it, so a crash never leaves half a
  file; a plainloop checkpoint (a dict with a "model" entry) gets a sha256 digest of its contents as one more
  entry.
- `load_checkpoint` never unpickles arbitrary objects (a pickle payload is refused, never run), reports
  damaged files (random bytes, truncation, a flipped bit caught by the digest) as corrupt, naming the file,
  and still loads older checkpoints written without a digest (marked unverified).
- `storable` checks what callbacks and models put in a checkpoint at the save: NumPy values become tagged tensors
  (`load_checkpoint` turns them back), anything weights_only=True could not load is refused, naming its key.
- `remove_orphan_temps` deletes the temp files a killed writer left behind.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import io
import os
import pickle
import pickletools
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from copy import deepcopy
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from .files import atomic_write, check_free_space

DIGEST_KEY = "digest"  # entry of a saved plainloop checkpoint: "sha256:<hex>" over every other entry
INTEGRITY_KEY = "integrity"  # set by load_checkpoint on what it returns: "verified" or "unverified: ..."
UNVERIFIED = "unverified: written without a digest (an older checkpoint); damage inside it would go unnoticed"

# a state read back from a checkpoint file, as load_state_dict() takes it: torch.load gives its values no types
StateDict = dict[str, Any]


class CheckpointError(RuntimeError):
    pass


def _tensor_bytes(obj: object) -> int:
    """About how many bytes torch.save writes for `obj`: its tensors' storage (a lower bound; walks <= 100k items)."""
    total, stack, seen = 0, [obj], 0
    while stack and seen < 100_000:
        o = stack.pop()
        seen += 1
        if isinstance(o, torch.Tensor):
            total += o.numel() * o.element_size()
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple):
            stack.extend(o)
    return total


# ---------------------------------------------------------------------------------------------- digest


def state_digest(obj: object) -> str:
    """sha256 over a canonical serialisation: every tensor's dtype, shape and bytes, and every other entry.

    Dict order is part of it (pickle and torch.load keep insertion order), lists and tuples hash alike.
    CUDA tensors are copied to the host for hashing.
    """
    h = hashlib.sha256()

    def put(tag: bytes, payload: bytes | memoryview) -> None:
        # a tag and a length prefix keep the stream unambiguous ("ab","c" never hashes like "a","bc")
        h.update(tag + len(payload).to_bytes(8, "little"))
        h.update(payload)

    def feed(obj: object) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            put(b"T", f"{t.dtype}|{tuple(t.shape)}".encode())
            try:
                if t.layout != torch.strided:
                    t = t.to_dense()
                if t.device.type != "cpu":
                    t = t.to("cpu")  # note: sync point (checkpoint), as torch.save's own copy is
                if t.is_quantized:  # its integers, and what maps them to values
                    per_tensor = t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric)
                    feed((t.q_scale(), t.q_zero_point()) if per_tensor else (
                        t.q_per_channel_scales(), t.q_per_channel_zero_points(), t.q_per_channel_axis()))  # fmt: skip
                    t = t.int_repr()
                t = t.resolve_conj().resolve_neg().contiguous()
                # its memory as uint8, without a copy (`t` stays alive until put(): the view points into it)
                view = t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else memoryview(b"")
            except (RuntimeError, TypeError, ValueError):  # exotic tensors: hash their values instead
                put(b"V", repr(obj.detach().to("cpu").tolist()).encode())
                return
            put(b"B", view)
        elif isinstance(obj, dict):
            put(b"D", str(len(obj)).encode())
            for k, v in obj.items():
                feed(k)
                feed(v)
        elif isinstance(obj, list | tuple):
            put(b"L", str(len(obj)).encode())
            for v in obj:
                feed(v)
        elif isinstance(obj, np.ndarray) and obj.dtype != object:
            a = np.ascontiguousarray(obj)
            put(b"A", f"{a.dtype.str}|{a.shape}".encode())
            put(b"B", a.reshape(-1).view(np.uint8).data)
        elif isinstance(obj, str):
            put(b"S", obj.encode("utf-8", "surrogatepass"))
        elif isinstance(obj, bytes | bytearray):
            put(b"Y", bytes(obj))
        else:  # None, bool, int, float (repr round-trips exactly, nan included), complex, dtype, device, ...
            put(b"O", f"{type(obj).__name__}:{obj!r}".encode())

    feed(obj)
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------------------------------------ save


def atomic_save(obj: object, path: str | os.PathLike, *, digest: bool | None = None) -> Path:
    """torch.save to a temp file in the same folder, fsync, then rename: a crash never leaves half a file.

    digest: add a DIGEST_KEY entry to a dict; None (default) = only for a plainloop checkpoint (a dict with a
    "model" entry), so plain state dicts stay loadable by `model.load_state_dict` as they are.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if digest is None:
        digest = isinstance(obj, dict) and "model" in obj
    if digest:
        if not isinstance(obj, dict):
            raise TypeError(f"atomic_save(digest=True) needs a dict, got {type(obj).__name__}")
        body = {k: v for k, v in obj.items() if k != DIGEST_KEY}
        obj = {**body, DIGEST_KEY: state_digest(body)}
    check_free_space(path, _tensor_bytes(obj))
    return atomic_write(path, lambda f: torch.save(obj, f))


def snapshot_to_host(state: Mapping[str, object]) -> dict[str, object]:
    """A copy of a checkpoint's state that training can no longer change: every tensor copied to host memory
    (GPU tensors into pinned memory, all at once, then one wait), every dict/list/tuple rebuilt, other leaves
    deep-copied. A background writer then serialises it while the loop goes on."""
    cuda_devices: set[torch.device] = set()

    def copy(o: object) -> object:
        if isinstance(o, torch.Tensor):
            t = o.detach()
            if t.device.type == "cuda":
                cuda_devices.add(t.device)
                return t.to("cpu", non_blocking=True)  # lands in pinned memory; valid after the sync below
            return t.to("cpu").clone()
        if isinstance(o, dict):
            d = {k: copy(v) for k, v in o.items()}
            return d if type(o) is dict else type(o)(d)  # OrderedDict state dicts keep their type
        if isinstance(o, list):
            return [copy(v) for v in o]
        if isinstance(o, tuple):
            items = [copy(v) for v in o]
            if hasattr(o, "_fields"):  # a namedtuple: its class takes the fields one by one
                namedtuple_class: Callable[..., object] = type(o)
                return namedtuple_class(*items)
            return tuple(items)
        if o is None or isinstance(o, str | bytes | int | float | bool | complex | torch.dtype | torch.device):
            return o
        return deepcopy(o)

    out = {k: copy(v) for k, v in state.items()}
    for dev in cuda_devices:  # note: sync point (checkpoint): the copies must land before training moves on
        torch.cuda.current_stream(dev).synchronize()
    return out


# ------------------------------------------------------------------------------ what a checkpoint may hold
NUMPY_KEY = "__plainloop_numpy__"  # {NUMPY_KEY: dtype.str, "shape": [...], "data": tensor[, "scalar": True]}
# leaves torch.load(weights_only=True) gives back as they were (and the digest hashes alike in every process)
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device,
                    torch.layout, torch.Size})  # fmt: skip
_CONTAINERS = (dict, OrderedDict, list, tuple)  # exactly these: subclasses do not load back


class NotStorable(CheckpointError):
    """A value that a checkpoint loaded with weights_only=True cannot give back; the message names its key."""


def storable(obj: object, path: str = "checkpoint", depth: int = 0) -> object:
    """`obj` as a checkpoint file holds it: NumPy arrays and scalars become tagged tensors (load_checkpoint turns
    them back, dtype and shape kept), tensors and plain values (dict, list, tuple, str, numbers, None) stay, the
    same objects when nothing inside changed. Anything else raises NotStorable naming its key path."""
    kind = type(obj)
    if kind in _PLAIN or isinstance(obj, torch.Tensor):
        return obj
    if depth > 100:
        raise NotStorable(f"{path}: nested more than 100 levels deep (a container that holds itself?)")
    if isinstance(obj, np.generic) or (isinstance(obj, np.ndarray) and kind in (np.ndarray, np.memmap)):
        if not obj.dtype.hasobject and obj.dtype.fields is None:
            a = np.ascontiguousarray(obj)
            try:  # a tensor of the same dtype where torch has it (readable anywhere), else the raw bytes
                data = torch.from_numpy(a if a.flags.writeable else a.copy())
            except (TypeError, ValueError):  # strings, dates, long double, another byte order
                data = torch.from_numpy(a.reshape(-1).view(np.uint8).copy())
            out = {NUMPY_KEY: obj.dtype.str, "shape": list(obj.shape), "data": data}
            return {**out, "scalar": True} if isinstance(obj, np.generic) else out
    elif isinstance(obj, dict | list | tuple) and kind in _CONTAINERS:
        return _map(obj, lambda k, v: storable(v, f"{path}[{k!r}]", depth + 1) if _key_ok(k, path) else v)
    raise NotStorable(f"{path}: {_not_storable(obj)}")


def _map(obj: dict | list | tuple, fn: Callable[[Any, Any], object]) -> object:
    """`obj` with fn(key, value) for each of its values: the same object when none changed. A module's state_dict
    keeps its `_metadata` (load_state_dict reads the layers' versions there)."""
    pairs = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj))
    new = [fn(k, v) for k, v in pairs]
    if all(a is v for a, (_, v) in zip(new, pairs)):
        return obj
    if not isinstance(obj, dict):
        return type(obj)(new)
    out = type(obj)(zip((k for k, _ in pairs), new))
    if "_metadata" in getattr(obj, "__dict__", {}):
        vars(out)["_metadata"] = vars(obj)["_metadata"]
    return out


def _key_ok(key: object, path: str) -> bool:
    if type(key) in _PLAIN or (isinstance(key, tuple) and type(key) is tuple and all(type(k) in _PLAIN for k in key)):
        return True
    raise NotStorable(f"{path}: the key {key!r} is of type {type(key).__name__}; use str, int or float keys")


def _not_storable(obj: object) -> str:
    """Why `obj` cannot be in a checkpoint, and what to store instead."""
    name = type(obj).__name__
    if isinstance(obj, set | frozenset):
        return f"a {name} is not storable (its order differs between processes); store a sorted list or a tensor"
    if inspect.isroutine(obj) or isinstance(obj, type | functools.partial):
        what = "class" if isinstance(obj, type) else "function"
        return f"a {what} is not storable (a checkpoint holds data, not code); store the values it needs instead"
    if isinstance(obj, np.ndarray | np.generic):
        return f"a NumPy value of dtype {obj.dtype} is not storable; store an array of numbers, or a list"
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return f"a namedtuple {name} is not storable; store tuple(x) or x._asdict()"
    if isinstance(obj, dict | list | tuple):
        return f"a {name} is not storable; store it as a plain {type(obj).__mro__[-2].__name__}"
    return (
        f"a {type(obj).__module__}.{type(obj).__qualname__} object is not storable (checkpoints load with "
        f"weights_only=True, which refuses classes); store its state as a dict of tensors, arrays and plain values "
        f"(e.g. its state_dict() or vars()) and build it again on load"
    )


def restore(obj: object) -> object:
    """A checkpoint's values as they were saved: the tagged tensors of `storable` back to NumPy arrays/scalars."""
    if isinstance(obj, dict) and NUMPY_KEY in obj:
        dtype = np.dtype(obj[NUMPY_KEY])
        if dtype.hasobject:  # never from a file: object arrays are pointers
            raise CheckpointError(f"a stored NumPy array claims dtype {dtype}, which no checkpoint holds")
        raw = obj["data"].detach().cpu().numpy()
        arr = (raw if raw.dtype == dtype else raw.view(dtype)).reshape(obj["shape"])
        return arr[()] if obj.get("scalar") else arr
    if isinstance(obj, dict | list | tuple) and type(obj) in _CONTAINERS:
        return _map(obj, lambda k, v: restore(v))
    return obj


# ------------------------------------------------------------------------------------------------ load


def _is_pickle_stream(data: IO[bytes]) -> bool:
    """True when `data` parses as a pickle opcode stream up to STOP (raises on bytes that do not). Parses only;
    nothing is executed."""
    for n, (op, _, _) in enumerate(pickletools.genops(data)):
        if op.name == "STOP" or n >= 2_000_000:  # a long, still-valid stream: random bytes fail within a few opcodes
            return True
    return False


def _looks_like_pickle(path: Path) -> bool:
    """Is the file (or the data.pkl inside a torch zip) a well-formed pickle? Separates "holds pickled
    objects" from "damaged bytes", whose weights_only errors can read alike."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
                return bool(names) and _is_pickle_stream(io.BytesIO(z.read(names[0])))  # z.read checks the CRC
        with open(path, "rb") as f:
            return _is_pickle_stream(f)
    except Exception:  # damaged bytes, or a zip whose records are damaged: corrupt, whatever the pickle says
        return False


def _detail(e: BaseException) -> str:
    """The informative line of an exception (torch's weights_only errors open with a generic paragraph)."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    useful = [
        s
        for s in lines
        if not s.startswith(("Weights only load failed", "Please file an issue", "Check the documentation"))
    ]
    text = (useful or lines or [""])[0]
    if len(text) > 200:  # whole sentences only (torch's zip reader appends advice cut off mid-sentence at 200)
        cut = text[:200].rfind(". ")
        text = text[: cut + 1] if cut > 0 else text[:200] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def safe_load(path: Path, map_location: str | torch.device = "cpu") -> object:
    """torch.load with weights_only=True: a file holding pickled objects is refused (never run), damaged bytes
    are reported as corrupt; both name the file."""
    try:
        with warnings.catch_warnings():  # damaged bytes can look like an odd pickle protocol: not news
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except MemoryError:
        raise
    except Exception as e:
        # a weights_only refusal of a well-formed pickle means pickled objects (classes, functions); damaged
        # bytes raise the same error class, so the stream's shape decides, not the message
        if isinstance(e, pickle.UnpicklingError) and _looks_like_pickle(path):
            raise CheckpointError(
                f"refusing to load {path}: it is not loadable with weights_only=True (it holds pickled Python "
                f"objects, which could run code). Only plainloop checkpoints or plain state dicts are accepted. "
                f"Detail: {_detail(e)}"
            ) from None
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated and cannot be read ({_detail(e)}); "
            f"use another checkpoint (best.pt, an earlier copy) or start the run again"
        ) from None
    return ckpt


def check_digest(ckpt: StateDict, path: Path, verify: bool = True) -> StateDict:
    """`ckpt` (as safe_load read it from `path`) without its digest entry, checked against it, its NumPy values
    restored; its INTEGRITY_KEY entry says "verified" or why not (UNVERIFIED for checkpoints without a digest)."""
    stored = ckpt.pop(DIGEST_KEY, None)
    if stored is None:
        ckpt[INTEGRITY_KEY] = UNVERIFIED
    elif not verify:
        ckpt[INTEGRITY_KEY] = "unverified: digest check skipped (verify=False)"
    elif not isinstance(stored, str) or state_digest(ckpt) != stored:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its contents do not match the digest written with it (damaged "
            f"on disk or in a copy); use another checkpoint (best.pt, an earlier copy) or start the run again"
        )
    else:
        ckpt[INTEGRITY_KEY] = "verified"
    try:
        return cast(StateDict, restore(ckpt))
    except (KeyError, TypeError, ValueError, AttributeError, CheckpointError) as e:  # a hand-made marker entry
        raise CheckpointError(f"checkpoint {path} has a damaged NumPy entry ({_detail(e)}); use another") from None

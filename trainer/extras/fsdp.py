"""--strategy fsdp: each block's parameters, gradients and optimizer state sharded over the
processes (FSDP2, `torch.distributed.fsdp.fully_shard`).

`shard_model` (plugged into the core through trainer/layers.py SHARDERS) shards the user's module
in place, one unit per block and then the root, gives it DDP's `no_sync()` (an accumulation window
reduces its gradients once) and returns a `Sharding`: the registry's model and optimizer parts.
Those write both states through `torch.distributed.checkpoint` into one folder beside the
checkpoint file (checkpoints/last.<id>.dcp), under a temporary name renamed when whole; the file
(last.pt) names it. A folder written by N processes loads on M (resharded). `export_model` turns a
run's folder into one plain file.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import format_utils
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from ..checkpoint import load_checkpoint
from ..config import TrainConfig
from ..runtime import Runtime

__all__ = ["Sharding", "export_model", "fsdp_units", "shard_model"]


NOT_YET = "is not supported yet with --strategy fsdp"


def refusal(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> str | None:
    """What --strategy fsdp does not run yet, in one line, or None."""
    if cfg.compile_model:
        return f"--compile_model {NOT_YET}: leave one of them out"
    if cfg.ema_decay is not None:
        return f"--ema_decay {NOT_YET} (the EMA copies whole weights): leave it out"
    if rt.amp_dtype == torch.float16:
        return f"--precision 16-mixed (GradScaler) {NOT_YET}: use --precision bf16-mixed or 32"
    if cfg.fsdp_cpu_offload and rt.device.type != "cuda":
        return "--fsdp_cpu_offload moves the shards off a GPU, and this run is on the CPU: leave it out"
    if cfg.sync_batchnorm:
        return f"--sync_batchnorm {NOT_YET}: leave it out"
    if cfg.save_top_k > 1:
        return f"--save_top_k above 1 {NOT_YET}: leave it at 1 (best.pt)"
    lightning = ("training_step", "configure_model")
    if any(callable(getattr(model, a, None)) for a in lightning):
        return (
            f"a LightningModule-style model ({type(model).__name__}: training_step, "
            f"configure_model) {NOT_YET}: use --strategy ddp, or give a plain nn.Module"
        )
    return None


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The blocks sharded one by one (each all-gathered only while it runs): the model's
    `fsdp_units` (module classes) when it names them; else the entries of its nn.ModuleLists that
    hold parameters; else every outermost module whose class holds parameters and repeats. The root
    is sharded after them, holding the rest."""
    named = getattr(model, "fsdp_units", None)
    if named is not None:
        classes = tuple(named)
        return [m for m in model.modules() if m is not model and isinstance(m, classes)]
    with_params = [m for m in model.modules() if m is not model and next(m.parameters(), None) is not None]
    ids = {id(m) for m in with_params}
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    listed = {id(e) for m in lists for e in m if id(e) in ids}
    if not listed:
        counts = Counter(type(m) for m in with_params)
        listed = {id(m) for m in with_params if counts[type(m)] > 1}
    units: list[nn.Module] = []
    for m in with_params:  # outermost first (modules() is depth-first, parents before children)
        if id(m) in listed and not any(_contains(u, m) for u in units):
            units.append(m)
    return units


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


@contextlib.contextmanager
def _no_sync(model: Any) -> Iterator[None]:
    """DDP's no_sync() for the sharded root (FSDP2's set_requires_gradient_sync): the loop's
    accumulation window reduces the gradients once, at its last micro-step."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _reshard_without_grad(model: nn.Module, args: Any, out: Any) -> None:
    if not torch.is_grad_enabled():
        model.reshard()  # type: ignore[operator]


def shard_model(model: nn.Module, cfg: TrainConfig, rt: Runtime, notes: list[str]) -> Sharding | None:
    """Shard `model` in place when cfg.strategy is fsdp (a line in `notes`), or None; what is not
    supported yet raises ValueError, one line."""
    if cfg.strategy != "fsdp":
        return None
    if why := refusal(cfg, rt, model):
        raise ValueError(why)
    if not dist.is_initialized():  # one process (a resume onto 1): a group of one to shard over
        backend = "gloo" if rt.device.type == "cpu" else "nccl"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    cuda = rt.device.type == "cuda"
    # bf16 shards all-gathered in bf16, gradients reduced in fp32; gloo on a CPU keeps fp32 shards
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy: dict[str, Any] = {"mp_policy": mp} if cuda and rt.amp_dtype == torch.bfloat16 else {}
    if cfg.fsdp_cpu_offload:
        policy["offload_policy"] = CPUOffloadPolicy()
    units = fsdp_units(model)
    kinds = ", ".join(f"{type(u).__name__} x {n}" for u, n in _count(units))  # before renaming
    for unit in units:
        fully_shard(unit, **policy)
    fully_shard(model, **policy)
    # FSDP2 keeps the root gathered after its forward (backward needs it next): not after an evaluation's
    model.register_forward_hook(_reshard_without_grad)
    object.__setattr__(model, "no_sync", functools.partial(_no_sync, model))  # DDP's, for the loop
    notes.append(
        f"fsdp: {len(units)} unit(s) ({kinds or 'none'}) and the root, sharded over "
        f"{rt.world_size} process(es)"
        f"{'; bf16 parameters, fp32 gradient reduction' if 'mp_policy' in policy else ''}"
        f"{'; shards kept in CPU memory' if cfg.fsdp_cpu_offload else ''}"
    )
    return Sharding(model, rt, notes)


def _count(units: list[nn.Module]) -> list[tuple[nn.Module, int]]:
    first: dict[type, nn.Module] = {}
    for u in units:
        first.setdefault(type(u), u)
    counts = Counter(type(u) for u in units)
    return [(u, counts[t]) for t, u in first.items()]


class Sharding:
    """The sharded model as the run's state registry takes it (state.py register_run_state)."""

    def __init__(self, model: nn.Module, rt: Runtime, notes: list[str]) -> None:
        self.model, self.rt, self.notes = model, rt, notes

    def sharded_parts(self, optimizer: torch.optim.Optimizer, run_state: Any) -> tuple[Any, Any]:
        """The registry's "model" and "optimizer" parts."""
        state = ShardedState(self.model, optimizer, run_state, self.rt, self.notes)
        return state, OptimizerInFolder()


class OptimizerInFolder:
    """The optimizer's entry: its state is in the model's folder (ShardedState writes both)."""

    def state_dict(self) -> dict[str, Any]:
        return {"in": "the model's dcp folder"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ShardedState:
    """The model's and optimizer's sharded state. `state_dict()` writes it (every rank: a
    collective) into a DCP folder beside the checkpoint being written (the registry's `target`) and
    returns what names it; `load_state_dict` reads it back on any number of processes. At most two
    folders per checkpoint name: the one its file names, and a newer one until the file names it."""

    def __init__(
        self, model: nn.Module, optim: torch.optim.Optimizer, run_state: Any, rt: Runtime, notes: list[str]
    ) -> None:
        self.model, self.optimizer, self.run_state, self.rt = model, optim, run_state, rt
        self.notes = notes
        self.kept: dict[str, str] = {}  # checkpoint stem ("last") -> the folder its file names

    def _states(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def state_dict(self) -> dict[str, Any]:
        target = Path(self.run_state.target)  # checkpoints/last.pt
        box = [uuid.uuid4().hex[:8] if self.rt.is_main else None]
        dist.broadcast_object_list(box, src=0)  # one name on every rank
        stem, folder = target.stem, target.parent
        name = f"{stem}.{box[0]}.dcp"
        tmp = folder / f".{name}.tmp"
        dcp.save(self._states(), checkpoint_id=tmp)  # each rank its shards; rank 0 the metadata
        if self.rt.is_main:
            tmp.rename(folder / name)  # a folder without the temporary name is whole
            for old in [*folder.glob(f"{stem}.*.dcp"), *folder.glob(f".{stem}.*.dcp.tmp")]:
                if old.name not in (name, self.kept.get(stem)):
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        self.kept[stem] = name
        return {"dcp": name, "world_size": self.rt.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        source = Path(self.run_state.source)
        folder = (source / "checkpoints" if source.is_dir() else source.parent) / str(state.get("dcp"))
        if "dcp" not in state or not (folder / ".metadata").is_file():
            raise ValueError(
                f"{source}: its model state is not a sharded (--strategy fsdp) folder, or {folder} "
                f"is missing: resume it with the strategy it was written with"
            )
        states = self._states()
        dcp.load(states, checkpoint_id=folder)
        set_state_dict(self.model, self.optimizer, model_state_dict=states["model"], optim_state_dict=states["optim"])
        self.kept[folder.name.split(".")[0]] = folder.name
        old, now = int(state.get("world_size", self.rt.world_size)), self.rt.world_size
        if old != now:
            self.notes.append(
                f"resume: the model and optimizer state of {old} processes resharded onto {now} "
                f"({folder.name}); the effective batch is now batch_size x {now} x accumulation"
            )


def export_model(run: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the model of a run (its directory, or a checkpoint file) as one state dict that
    `torch.load(out, weights_only=True)` reads: a sharded (fsdp) run's folder consolidated, a plain
    run's weights copied. No process group needed. Returns `out`."""
    path = Path(run)
    file = path / "checkpoints" / "last.pt" if path.is_dir() else path
    ckpt = load_checkpoint(file, map_location="cpu")
    model = ckpt.get("model")
    if not isinstance(model, dict):
        raise ValueError(f"{file}: holds no model state; give a run directory or a checkpoint")
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if "dcp" in model:  # the folder consolidated into one file, then its model entries kept
        whole = out_path.with_name(f".{out_path.name}.whole")
        format_utils.dcp_to_torch_save(file.parent / str(model["dcp"]), whole)
        weights = torch.load(whole, map_location="cpu", weights_only=True)["model"]
        whole.unlink()
    else:
        weights = model
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    torch.save(weights, tmp)
    tmp.replace(out_path)
    return out_path


def main(argv: list[str]) -> int:
    """`plainloop export RUN_DIR [OUT]`: the run's model as one file (default RUN_DIR/model.pt)."""
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help"):
        print("usage: plainloop export RUN_DIR [OUT]   (default OUT: RUN_DIR/model.pt)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    out = argv[1] if len(argv) == 2 else Path(argv[0]) / "model.pt"
    try:
        path = export_model(argv[0], out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{path}: the model's weights (torch.load(..., weights_only=True), load_state_dict)")
    return 0

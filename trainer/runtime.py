"""Device, precision and process-group setup: everything decided once, before the first step.

Every correction of a setting that cannot work here (fp16 on a CPU, pinning without CUDA, ...) is made
once and reported in one line; the loop never re-checks per step.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .support import rng_state, seed_everything, set_rng_state

__all__ = [  # the random state is the leaf's, public here too
    "Runtime", "cleanup_distributed", "cpu_threads", "init_distributed", "launch_prefix", "resolve_runtime",
    "rng_state", "seed_everything", "set_rng_state",
]  # fmt: skip


@dataclass
class Runtime:
    device: torch.device
    precision: str  # resolved: "32", "16-mixed" or "bf16-mixed"
    amp_dtype: torch.dtype | None  # None = no autocast
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    notes: list[str] = field(default_factory=list)  # one line per corrected/auto-chosen setting

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)


def init_distributed() -> tuple[int, int, int]:
    """Join the torchrun process group when WORLD_SIZE > 1; return (rank, local_rank, world_size)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 0, 1
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if torch.cuda.is_available():  # nccl, one GPU per rank; else gloo
            torch.cuda.set_device(local_rank)
        # torch._dynamo imported after init_process_group keeps the group alive past destroy_process_group()
        # (torch 2.13; DDP imports it), and with it gloo's threads; imported first, it does not.
        importlib.import_module("torch._dynamo")
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        # a process group still alive at interpreter exit can abort the process (gloo's threads): end it first
        atexit.register(cleanup_distributed)
    return rank, local_rank, world_size


def launch_prefix(env: Mapping[str, str] = os.environ) -> str:
    """How this job was started, for the commands the run prints: "python", or under torchrun (WORLD_SIZE > 1) its
    torchrun prefix, since a plain "python" would continue the run with one process. A multi-node prefix names
    NODE_RANK, to be replaced on each node."""
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return "python"
    per_node = int(env.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    nodes = max(1, world // per_node)
    if nodes == 1:
        return f"torchrun --standalone --nproc_per_node {per_node}"
    addr, port = env.get("MASTER_ADDR", "HOST0"), env.get("MASTER_PORT", "29500")
    return (
        f"torchrun --nnodes {nodes} --node_rank NODE_RANK --nproc_per_node {per_node} --master_addr {addr} "
        f"--master_port {port}"
    )


def resolve_runtime(
    precision: str, device: str | None = None, tf32: bool = True, cudnn_benchmark: bool = True
) -> Runtime:
    """Pick the device and the precision that works on it; set TF32 / cudnn.benchmark on CUDA."""
    rank, local_rank, world_size = init_distributed()
    notes: list[str] = []
    if device is None:
        dev = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available here; use --device cpu or leave it unset")

    if dev.type == "cuda":
        # TF32 runs fp32 matmuls on tensor cores (~10-bit mantissa): the seed's "enable TensorCore" switch.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.benchmark = cudnn_benchmark
        bf16_ok = torch.cuda.is_bf16_supported()
        fp16_ok = torch.cuda.get_device_capability(dev)[0] >= 6
    else:
        # CPU autocast runs bf16 when asked; fp16 needs the GradScaler's CUDA kernels here.
        bf16_ok, fp16_ok = True, False

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    resolved = precision
    if precision == "auto":
        # On a CPU, auto keeps fp32: bf16 autocast trained the CPU demo at ~0.6x fp32's speed (AVX512-BF16, no AMX).
        resolved = ("bf16-mixed" if bf16_ok else "16-mixed" if fp16_ok else "32") if dev.type == "cuda" else "32"
        notes.append(f"precision: auto -> {resolved} on {dev.type}")
    elif precision == "bf16-mixed" and not bf16_ok:
        resolved = "16-mixed" if fp16_ok else "32"
        notes.append(f"precision: bf16-mixed is not supported on {name}; using {resolved}")
    elif precision == "16-mixed" and not fp16_ok:
        resolved = "32"
        notes.append(f"precision: 16-mixed needs a CUDA GPU (found {name}); using 32")
    amp_dtype = {"32": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}[resolved]
    return Runtime(dev, resolved, amp_dtype, rank, local_rank, world_size, notes)


# parameters: below this a CPU step's products are too small to split; more threads wait on each other, and on
# shared cores lose a lot (the CPU demo's first 40 steps: 8-22 s with 1 thread, 21-44 s with 2, 2 busy cores)
SMALL_MODEL = 200_000


def cpu_threads(requested: int | None, device: torch.device, parameters: int) -> str | None:
    """Set torch's intra-op threads for a run on a CPU: `requested` when given, else 1 for a model under
    SMALL_MODEL parameters (torch's one per core otherwise); the line that says so, or None when nothing changes."""
    now = torch.get_num_threads()
    want = requested if requested is not None else 1 if parameters < SMALL_MODEL else now
    if device.type != "cpu" or want == now:
        return None
    torch.set_num_threads(want)
    if requested is not None:
        return f"threads: {now} -> {want} torch intra-op thread(s) (num_threads)"
    return (
        f"threads: {now} -> 1 torch thread: a model of {parameters:,} parameters on a CPU gains nothing from more "
        f"(under {SMALL_MODEL:,}, they wait on each other); num_threads={now} (--num_threads {now}) keeps {now}"
    )


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

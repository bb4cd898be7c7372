"""Operators per training step of the SST task as plainloop trains it: what launches copies, casts and small ops.

    .venv/bin/python -m benchmarks.op_count                          # bf16 autocast with CUDA's cast rules
    .venv/bin/python -m benchmarks.op_count --precision 32 --out benchmarks/results/op_count_fp32.json

Counts, not times: no figure depends on the machine's load. The task is build_era5_task on the built-in sample (or
--data-path) with the full preset's model shape (3 layers x 2 recursions, 8 heads, dropout 0.1, one input month,
calendar on, prior auto) at a CPU-sized width; width, grid and batch change no count. plainloop's Trainer runs
--warmup steps, then torch.profiler records --steps steps with a mark at every on_train_batch_end: an interval holds
everything the loop does for one step (log point, gather, forward, loss, backward, optimizer step).

The CPU is not the GPU; where they differ the harness counts what a GPU launches:
  --policy cuda  (default) layer_norm under autocast runs as CUDA's autocast runs it, in float32 with its input cast
                 up (the CPU's autocast lets it through in bf16, with no cast); the other operators this model uses
                 follow the same autocast rules on both
  fused ops      attention, dropout, fused AdamW and the for-each ops are one kernel on a GPU (OPAQUE); what the CPU
                 runs inside them (the attention's math path, the optimizer's scalar reads) is not counted, and
                 their gradient counts once
  atomic ops     matmuls, norms and reductions are one kernel; the CPU's copies inside them (addmm's bias, sum's
                 bool-to-int cast) and inside an elementwise op (a mixed-dtype add converts its input first, where
                 a GPU kernel converts as it reads) are not counted

Per step the JSON gives
  aten_ops      every aten operator the profiler records, nested ones included
  kernels       what a GPU would launch: leaf operators less views and allocations, fused and atomic ops once
  copy_         every aten::copy_ as the profiler records it (the GPU profile's figure counts the same calls)
  cast/copy     the copy kernels: _to_copy (a cast), clone (a layout copy: reshape, contiguous), a direct copy_
  by category   kernels split into cast/copy, elementwise, matmul, norm/softmax, reduction, rng, concat/index, sync
  by phase      forward, loss, backward, optimizer, data (the split's gather), loop (the rest)
  sites         the top call sites in the project of the kernels and of the copies (function, then the call it
                made); a backward kernel is placed at the forward call that made its autograd node
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks import common as bc

ROOT = str(Path(__file__).resolve().parent.parent) + "/"
MARK, FORWARD, LOSS, DATA = (f"op_count::{k}" for k in ("step_end", "forward", "loss", "data"))
# One fused kernel each on a GPU (flash/efficient attention, native dropout, fused AdamW, multi-tensor for-each);
# the CPU runs some of them as many small operators, which are not what a GPU launches.
OPAQUE_PREFIX = ("aten::scaled_dot_product_attention", "aten::dropout", "aten::native_dropout", "aten::_fused_adam",
                 "aten::_foreach_", "aten::_amp_foreach_")  # fmt: skip
# no kernel: views, metadata, allocations, conjugation flags
NO_KERNEL = {"aten::" + n for n in (
    "view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "expand_as", "unsqueeze", "squeeze",
    "select", "slice", "narrow", "unbind", "split", "split_with_sizes", "chunk", "detach", "detach_", "alias",
    "resolve_conj", "resolve_neg", "lift_fresh", "reshape", "_reshape_alias", "view_as", "contiguous", "to", "empty",
    "empty_strided", "empty_like", "resize_", "set_", "numpy_T", "result_type", "_has_compatible_shallow_copy_type",
    "is_nonzero", "requires_grad_", "unflatten", "flatten", "movedim", "diagonal", "real", "imag", "type_as",
    "_autocast_to_reduced_precision", "_autocast_to_full_precision",
)}  # fmt: skip
CATEGORY = {
    "cast/copy": {"copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy"},
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "dot", "_addmm_activation", "addbmm"},
    "norm/softmax": {"native_layer_norm", "native_layer_norm_backward", "_softmax", "_softmax_backward_data",
                     "_safe_softmax", "_log_softmax", "_log_softmax_backward_data"},
    "reduction": {"sum", "mean", "amax", "amin", "max", "min", "all", "any", "norm", "linalg_vector_norm", "prod",
                  "var", "std", "argmax", "argmin", "count_nonzero", "logsumexp"},
    "rng": {"bernoulli_", "uniform_", "normal_", "random_"},
    "concat/index": {"cat", "stack", "index_select", "gather", "index", "index_put_", "scatter", "scatter_add_",
                     "take", "masked_select", "nonzero", "im2col", "col2im", "replication_pad2d", "_pad_enum",
                     "constant_pad_nd", "pad"},
    "sync": {"item", "_local_scalar_dense"},
}  # fmt: skip
_CAT_OF = {f"aten::{n}": c for c, names in CATEGORY.items() for n in names}
COPY_NAMES = ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::to")
# one kernel each, whatever the CPU does inside (addmm copies its bias first, sum casts a bool input)
ATOMIC = {f"aten::{n}" for c in ("matmul", "norm/softmax", "reduction") for n in CATEGORY[c]}


def category(name: str) -> str:
    if name.startswith(OPAQUE_PREFIX):
        return "fused (attention, dropout, optimizer)"
    return _CAT_OF.get(name, "elementwise")


# ------------------------------------------------------------------------------------------ counting
def _ancestors(e: Any) -> Iterator[Any]:
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


_FRAME = re.compile(r"^(.+\.py)\(\d+\): ")


@functools.cache
def _own_frame(name: str) -> bool:
    """A Python frame event ("path.py(line): function", with_stack=True) of the project's own code, not this
    harness's (the profiler names files relative to their sys.path entry)."""
    m = _FRAME.match(name)
    if m is None or m.group(1).startswith(("benchmarks/", "/")):
        return False
    return (Path(ROOT) / m.group(1)).is_file() and not m.group(1).startswith(("torch/", ".venv/"))


def _clean(name: str) -> str:
    return re.sub(r" of [^>]* object at 0x[0-9a-f]+", "", name)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One launch a GPU would make: its operator, phase of the step and the project's call site."""

    name: str
    phase: str
    site: str


class _Tree:
    """Facts of one profile's events: fused ancestry, phase and call site. A backward operator is placed at the
    forward operator that made its autograd node (same sequence number)."""

    def __init__(self, events: Sequence[Any]) -> None:
        self.fwd: dict[int, tuple[str, Any]] = {}  # sequence number -> (forward site, its fused root or None)
        # An operator that makes no node records the next number: the node's maker is the last one holding it.
        for e in sorted(events, key=lambda e: e.time_range.start):
            seq = getattr(e, "sequence_nr", -1)
            if seq >= 0 and e.name.startswith("aten::") and self.node(e) is None:
                self.fwd[seq] = (f"{self.forward_site(e)} ({e.name})", self.fused_root(e))

    @staticmethod
    def node(e: Any) -> Any:
        """The autograd node (evaluate_function event) `e` runs in, or None in the forward."""
        for p in [e, *_ancestors(e)]:
            if p.name.startswith("autograd::engine::evaluate_function"):
                return p
        return None

    @staticmethod
    def fused_root(e: Any) -> Any:
        """The outermost operator around (or equal to) `e` that is one fused kernel on a GPU, or None."""
        root = None
        for p in [e, *_ancestors(e)]:
            if p.name.startswith(OPAQUE_PREFIX):
                root = p
        return root

    def backward_root(self, e: Any) -> Any:
        """For a backward operator: the fused forward operator whose gradient it computes, or None."""
        node = self.node(e)
        return None if node is None else self.fwd.get(getattr(node, "sequence_nr", -1), ("", None))[1]

    @staticmethod
    def phase(e: Any) -> str:
        names = [p.name for p in _ancestors(e)]
        if any(n.startswith("autograd::engine::evaluate_function") for n in names):
            return "backward"
        for label, phase in ((LOSS, "loss"), (FORWARD, "forward"), (DATA, "data")):
            if label in names:
                return phase
        if any(n.startswith("Optimizer.") for n in names):
            return "optimizer"
        return "loop"

    @staticmethod
    def forward_site(e: Any) -> str:
        """The nearest project frame above `e` and the call it made towards `e` (a module or a torch function)."""
        path = [e, *_ancestors(e)]
        for i, p in enumerate(path):
            if _own_frame(p.name):
                via = next((q.name for q in reversed(path[:i]) if q.name.startswith(("nn.Module: ", "<built-in"))), "")
                return p.name + (f" > {_clean(via)}" if via else "")
        return "(torch internals)"

    def site(self, e: Any) -> str:
        node = self.node(e)
        if node is None:
            return self.forward_site(e)
        where = self.fwd.get(getattr(node, "sequence_nr", -1), ("?", None))[0]
        return f"{where} <- backward ({node.name.split(': ', 1)[-1]})"


def kernels_of(events: Sequence[Any], tree: _Tree | None = None) -> list[Kernel]:
    """What a GPU would launch for `events`: see _is_kernel; a fused operator (OPAQUE) once in the forward and once
    in the backward, whatever the CPU runs inside it."""
    tree = tree or _Tree(events)
    out: list[Kernel] = []
    seen: set[int] = set()
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        root = tree.fused_root(e) or tree.backward_root(e)
        if root is not None:
            key = id(root) * 2 + (tree.node(e) is not None)
            if key not in seen:  # the fused operator itself, or its gradient, once
                seen.add(key)
                back = tree.node(e) is not None
                out.append(Kernel(root.name + (" (backward)" if back else ""), tree.phase(e), tree.site(e)))
        elif _is_kernel(e) and not any(_is_kernel(p) for p in _ancestors(e) if p.name.startswith("aten::")):
            out.append(Kernel(e.name, tree.phase(e), tree.site(e)))
    return out


def _launches(e: Any) -> list[Any]:
    """The operators right below `e` that may launch something, looking through views and allocations."""
    out: list[Any] = []
    for c in e.cpu_children:
        if c.name.startswith("aten::"):
            out += _launches(c) if c.name in NO_KERNEL else [c]
    return out


def _is_kernel(e: Any) -> bool:
    """One launch: a matmul, norm or reduction (ATOMIC), or an operator with nothing below it but copies and casts:
    a leaf, a cast (_to_copy), a layout copy (clone), or an operator whose copies are the CPU's own (a mixed-dtype
    add converts its input first, a Python number becomes a tensor; a GPU kernel converts as it reads)."""
    if e.name in NO_KERNEL or not e.name.startswith("aten::"):
        return False
    return e.name in ATOMIC or all(c.name in ("aten::copy_", "aten::_to_copy") for c in _launches(e))


def summarise(events: Sequence[Any], steps: int, top: int = 25) -> dict[str, Any]:
    """Per-step counts of the aten operators in `events` (the profile of `steps` training steps)."""
    aten = [e for e in events if e.name.startswith("aten::")]
    tree = _Tree(events)
    per = float(max(steps, 1))
    kernels = kernels_of(events, tree)
    copies = [e for e in aten if e.name == "aten::copy_"]

    def rate(c: collections.Counter[str]) -> dict[str, float]:
        return {k: round(v / per, 2) for k, v in c.most_common()}

    def sites(ks: Sequence[Kernel]) -> list[dict[str, Any]]:
        c = collections.Counter((k.site, k.name) for k in ks)
        return [{"site": s, "op": n, "per_step": round(v / per, 2)} for (s, n), v in c.most_common(top)]

    casts = [k for k in kernels if category(k.name) == "cast/copy"]
    return {
        "steps": steps,
        "aten_ops": round(len(aten) / per, 2),
        "kernels": round(len(kernels) / per, 2),
        "copy_": round(len(copies) / per, 2),
        "cast_copy_kernels": round(len(casts) / per, 2),
        "calls": {n: round(sum(e.name == n for e in aten) / per, 2) for n in COPY_NAMES},
        "kernels_by_category": rate(collections.Counter(category(k.name) for k in kernels)),
        "kernels_by_phase": rate(collections.Counter(k.phase for k in kernels)),
        "cast_copy_by_phase": rate(collections.Counter(k.phase for k in casts)),
        "kernels_by_name": rate(collections.Counter(k.name for k in kernels)),
        "aten_ops_by_name": dict(list(rate(collections.Counter(e.name for e in aten)).items())[:40]),
        "cast_copy_sites": sites(casts),
        "kernel_sites": sites(kernels),
    }


def step_window(events: Sequence[Any]) -> tuple[list[Any], int]:
    """The events between the first and the last step mark, and how many steps that is."""
    marks = sorted(e.time_range.start for e in events if e.name == MARK)
    if len(marks) < 2:
        raise ValueError("op_count: fewer than two step marks in the profile")
    lo, hi = marks[0], marks[-1]
    return [e for e in events if lo <= e.time_range.start < hi and e.name != MARK], len(marks) - 1


# ------------------------------------------------------------------------------------------ running
@contextlib.contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """layer_norm as CUDA's autocast runs it: in float32, a lower-precision input cast up (and its gradient cast
    back); the CPU's autocast runs it in the input's dtype with no cast. Outside autocast nothing changes."""
    orig = F.layer_norm

    def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:  # fmt: skip
        dev = input.device.type
        if not torch.is_autocast_enabled(dev) or input.dtype == torch.float32:
            return orig(input, normalized_shape, weight, bias, eps)
        with torch.autocast(dev, enabled=False):
            w, b = (t.float() if t is not None else None for t in (weight, bias))
            return orig(input.float(), normalized_shape, w, b, eps)

    F.layer_norm = layer_norm
    try:
        yield
    finally:
        F.layer_norm = orig


def _policy(name: str) -> contextlib.AbstractContextManager[None]:
    return cuda_autocast_policy() if name == "cuda" else contextlib.nullcontext()


@contextlib.contextmanager
def labelled(obj: Any, name: str, label: str) -> Iterator[None]:
    """obj.name (a method of this object) runs inside record_function(label) while the block runs."""
    orig = getattr(obj, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        with record_function(label):
            return orig(*a, **k)

    setattr(obj, name, wrapped)
    try:
        yield
    finally:
        delattr(obj, name)


def profile_model_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "32",
                       policy: str = "cuda") -> dict[str, Any]:  # fmt: skip
    """One forward, loss and backward of `model` outside the loop (no optimizer, no data): summarise() of it."""
    amp = {"32": None, "bf16-mixed": torch.bfloat16}[precision]
    model.train()
    loss_fn: Any = model.loss
    with _policy(policy), profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        with record_function(MARK):
            pass
        with record_function(FORWARD):
            with torch.autocast("cpu", dtype=amp) if amp is not None else contextlib.nullcontext():
                pred = model(x)
                with record_function(LOSS):
                    loss = loss_fn(pred, y)
        loss.backward()
        with record_function(MARK):
            pass
    return summarise(*step_window(prof.events()))


def build_task(a: Any) -> Any:
    from tasks.era5 import build_era5_task

    kw = dict(d_model=a.d_model, num_heads=8, num_layers=3, dim_feedforward=2 * a.d_model, recursion_depth=2,
              dropout=0.1, seq_len=2, resolution=a.resolution, calendar=not a.no_calendar, prior=a.prior,
              ensemble=a.ensemble, seed=a.seed, data_path=a.data_path, cache_dir=a.cache_dir)  # fmt: skip
    with bc.quiet():
        return build_era5_task(**kw)


def profile_loop(task: Any, a: Any, with_stack: bool = True) -> tuple[list[Any], int]:
    """plainloop's Trainer on `task`: a.warmup steps, then a.steps profiled ones, one mark at every step end."""
    from trainer import Callback, TrainConfig, Trainer

    prof = profile(activities=[ProfilerActivity.CPU], with_stack=with_stack)
    first, last = a.warmup, a.warmup + a.steps
    on = [False]

    class Marks(Callback):
        def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
            step = trainer.progress.step
            if step == first:
                prof.start()
                on[0] = True
            if on[0]:
                with record_function(MARK):
                    pass
            if step == last and on[0]:
                prof.stop()
                on[0] = False

    model = task.model
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.enter_context(labelled(model, "forward", FORWARD))
        stack.enter_context(labelled(model, "loss", LOSS))
        stack.enter_context(labelled(task.train_set, "gather", DATA))
        stack.enter_context(_policy(a.policy))
        cfg = TrainConfig(max_steps=last + 1, batch_size=a.batch, output_dir=tmp, run_name="op_count", seed=a.seed,
                          device="cpu", precision=a.precision, validation_interval=10**6, progress_bar=False,
                          save_best=False, summary=False)  # fmt: skip
        with bc.quiet():
            Trainer(cfg, task, log=lambda _s: None, callbacks=[Marks()]).fit()
    return step_window(prof.events())


def render(result: dict[str, Any]) -> str:
    s, c, t, env = result["per_step"], result["config"], result["task"], result["environment"]
    head = (f"Operators per training step, SST task ({c['precision']}, {c['policy']} cast rules, {t['grid']} grid, "
            f"prior {t['prior']}), commit `{env['commit'][:12]}`, torch {env['torch']} on a CPU: counts, not "
            "times.")  # fmt: skip
    rows = [["aten ops (all, nested)", s["aten_ops"]], ["kernels (GPU-like)", s["kernels"]],
            ["aten::copy_ (all)", s["copy_"]], ["cast/copy kernels", s["cast_copy_kernels"]]]  # fmt: skip
    rows += [[f"kernels: {k}", v] for k, v in s["kernels_by_category"].items()]
    rows += [[f"phase: {k}", v] for k, v in s["kernels_by_phase"].items()]
    t1 = bc.md_table(["per step", "count"], rows)
    t2 = bc.md_table(["cast/copy site", "op", "per step"],
                     [[f"`{r['site']}`", r["op"], r["per_step"]] for r in s["cast_copy_sites"]])  # fmt: skip
    return f"{head}\n\n{t1}\n\n{t2}\n"


FLAGS = [("--precision", "bf16-mixed", "plainloop precision (the GPU runs bf16-mixed)",
          {"choices": ("32", "bf16-mixed")}),
         ("--policy", "cuda", "autocast cast rules: cuda (as a GPU casts) or cpu (torch's CPU rules)",
          {"choices": ("cuda", "cpu")}),
         ("--steps", 4, "profiled steps"), ("--warmup", 2, "steps before the profile"),
         ("--batch", 16, "samples per step"), ("--d-model", 64, "model width (no count depends on it)"),
         ("--resolution", 5.0, "grid in degrees"), ("--prior", "auto", "the task's prior"),
         ("--ensemble", 1, "members"), ("--no-calendar", False, "calendar channels off"), ("--seed", 0, "seed"),
         ("--data-path", None, "ERA5 file (default: the built-in sample)"),
         ("--cache-dir", None, "cache directory (default: plainloop's)"), ("--top", 25, "call sites listed"),
         ("--label", "", "free text stored with the result (e.g. which code it ran)"),
         ("--out", None, "JSON path (default: benchmarks/results/op_count_<precision>.json)")]  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = bc.parser(__doc__, FLAGS).parse_args(argv)
    torch.manual_seed(a.seed)
    task = build_task(a)
    events, steps = profile_loop(task, a)
    result = {
        "schema": "plainloop-bench-op-count-1",
        "command": bc.command("op_count", argv),
        "environment": bc.environment(torch.device("cpu")),
        "config": vars(a),
        "task": {k: task.info[k] for k in ("grid", "prior", "ensemble", "calendar", "model")},
        "per_step": summarise(events, steps, a.top),
    }
    tag = "fp32" if a.precision == "32" else "bf16"
    bc.write_result(Path(a.out) if a.out else bc.RESULTS_DIR / f"op_count_{tag}.json", result, render(result))
    return result


if __name__ == "__main__":
    main()

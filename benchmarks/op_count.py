"""Operators per training step of the SST task as plainloop trains it: what launches copies, casts and small ops.

    .venv/bin/python -m benchmarks.op_count                          # bf16 autocast with CUDA's cast rules
    .venv/bin/python -m benchmarks.op_count --precision 32 --out benchmarks/results/op_count_fp32.json

Counts, not times, made on a CPU: the kernels a GPU would launch (docs/benchmarks/index.md, "Operators per SST
training step", says how the CPU's operators are counted as a GPU's launches). plainloop's Trainer trains the task
of build_era5_task on the built-in sample (or --data-path) with the full preset's model shape at a CPU-sized width
(width, grid and batch change no count) for --warmup steps; then torch.profiler records --steps steps, with a mark
at every on_train_batch_end: an interval holds everything the loop does for one step.

Per step the JSON gives aten_ops (every aten operator, nested ones included), kernels (what a GPU would launch),
copy_ (every aten::copy_), cast_copy_kernels (_to_copy, clone, a direct copy_), the kernels by category and by
phase (forward, loss, backward, optimizer, data: the split's gather, loop: the rest), and the call sites of the
kernels and of the casts and copies; a backward kernel is placed at the forward call that made its autograd node.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import tempfile
from collections.abc import Sequence
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
_FRAME = re.compile(r"^(.+\.py)\(\d+\): ")
BACKWARD = "autograd::engine::evaluate_function"
Kernel = collections.namedtuple("Kernel", "name phase site")  # one launch a GPU would make


@functools.cache
def _own_frame(name: str) -> bool:
    """A Python frame event ("path.py(line): function", with_stack=True) of the project's own code, not this
    harness's (the profiler names files relative to their sys.path entry)."""
    m = _FRAME.match(name)
    if m is None or m.group(1).startswith(("benchmarks/", "/")):
        return False
    return (Path(ROOT) / m.group(1)).is_file() and not m.group(1).startswith(("torch/", ".venv/"))


def _node(e: Any) -> Any:
    """The autograd node (evaluate_function event) `e` runs in, or None in the forward."""
    return next((p for p in (e, *bc.ancestors(e)) if p.name.startswith(BACKWARD)), None)


def _fused(e: Any) -> Any:
    """The outermost operator around (or equal to) `e` that is one fused kernel on a GPU, or None."""
    return next((p for p in reversed((e, *bc.ancestors(e))) if p.name.startswith(OPAQUE_PREFIX)), None)


def _phase(e: Any) -> str:
    names = [p.name for p in bc.ancestors(e)]
    if any(n.startswith(BACKWARD) for n in names):
        return "backward"
    for label, phase in ((LOSS, "loss"), (FORWARD, "forward"), (DATA, "data")):
        if label in names:
            return phase
    return "optimizer" if any(n.startswith("Optimizer.") for n in names) else "loop"


def _site(e: Any) -> str:
    """The nearest project frame above `e` and the call it made towards `e` (a module or a torch function)."""
    path = [e, *bc.ancestors(e)]
    for i, p in enumerate(path):
        if _own_frame(p.name):
            via = next((q.name for q in reversed(path[:i]) if q.name.startswith(("nn.Module: ", "<built-in"))), "")
            return p.name + (" > " + re.sub(r" of [^>]* object at 0x[0-9a-f]+", "", via) if via else "")
    return "(torch internals)"


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


def kernels_of(events: Sequence[Any]) -> list[Kernel]:
    """What a GPU would launch for `events`: see _is_kernel; a fused operator (OPAQUE) once in the forward and once
    in the backward, whatever the CPU runs inside it. A backward operator is placed at the forward operator that
    made its autograd node (the same sequence number)."""
    made: dict[int, tuple[str, Any]] = {}  # sequence number -> (forward site, its fused root or None)
    # An operator that makes no node records the next number: the node's maker is the last one holding it.
    for e in sorted(events, key=lambda e: e.time_range.start):
        if getattr(e, "sequence_nr", -1) >= 0 and e.name.startswith("aten::") and _node(e) is None:
            made[e.sequence_nr] = (f"{_site(e)} ({e.name})", _fused(e))
    out: list[Kernel] = []
    seen: set[tuple[int, bool]] = set()
    for e in (e for e in events if e.name.startswith("aten::")):
        node = _node(e)
        maker = None if node is None else made.get(getattr(node, "sequence_nr", -1), ("?", None))
        root = _fused(e) or (maker[1] if maker else None)
        if root is not None:
            if (id(root), node is not None) in seen:
                continue  # the fused operator itself, or its gradient, once
            seen.add((id(root), node is not None))
            name = root.name + (" (backward)" if node is not None else "")
        elif _is_kernel(e) and not any(_is_kernel(p) for p in bc.ancestors(e)):
            name = e.name
        else:
            continue
        site = _site(e) if maker is None else f"{maker[0]} <- backward ({node.name.split(': ', 1)[-1]})"
        out.append(Kernel(name, _phase(e), site))
    return out


def summarise(events: Sequence[Any], steps: int, top: int = 25) -> dict[str, Any]:
    """Per-step counts of the aten operators in `events` (the profile of `steps` training steps)."""
    aten = [e for e in events if e.name.startswith("aten::")]
    per, kernels = float(max(steps, 1)), kernels_of(events)
    casts = [k for k in kernels if category(k.name) == "cast/copy"]

    def rate(c: collections.Counter[str]) -> dict[str, float]:
        return {k: round(v / per, 2) for k, v in c.most_common()}

    def sites(ks: Sequence[Kernel]) -> list[dict[str, Any]]:
        c = collections.Counter((k.site, k.name) for k in ks)
        return [{"site": s, "op": n, "per_step": round(v / per, 2)} for (s, n), v in c.most_common(top)]

    return {
        "steps": steps, "aten_ops": round(len(aten) / per, 2), "kernels": round(len(kernels) / per, 2),
        "copy_": round(sum(e.name == "aten::copy_" for e in aten) / per, 2),
        "cast_copy_kernels": round(len(casts) / per, 2),
        "calls": {n: round(sum(e.name == n for e in aten) / per, 2) for n in COPY_NAMES},
        "kernels_by_category": rate(collections.Counter(category(k.name) for k in kernels)),
        "kernels_by_phase": rate(collections.Counter(k.phase for k in kernels)),
        "cast_copy_by_phase": rate(collections.Counter(k.phase for k in casts)),
        "kernels_by_name": rate(collections.Counter(k.name for k in kernels)),
        "aten_ops_by_name": dict(list(rate(collections.Counter(e.name for e in aten)).items())[:40]),
        "cast_copy_sites": sites(casts), "kernel_sites": sites(kernels),
    }  # fmt: skip


def step_window(events: Sequence[Any]) -> tuple[list[Any], int]:
    """The events between the first and the last step mark, and how many steps that is."""
    marks = sorted(e.time_range.start for e in events if e.name == MARK)
    if len(marks) < 2:
        raise ValueError("op_count: fewer than two step marks in the profile")
    return [e for e in events if marks[0] <= e.time_range.start < marks[-1] and e.name != MARK], len(marks) - 1


# ------------------------------------------------------------------------------------------ running
def autocast_rules(policy: str) -> contextlib.AbstractContextManager[None]:
    """policy "cuda": layer_norm under autocast runs as CUDA's autocast runs it, in float32, a lower-precision input
    cast up (and its gradient cast back); "cpu": torch's CPU rules, which run it in the input's dtype with no cast."""
    orig = F.layer_norm

    def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:  # fmt: skip
        dev = input.device.type
        if not torch.is_autocast_enabled(dev) or input.dtype == torch.float32:
            return orig(input, normalized_shape, weight, bias, eps)
        with torch.autocast(dev, enabled=False):
            w, b = (t.float() if t is not None else None for t in (weight, bias))
            return orig(input.float(), normalized_shape, w, b, eps)

    return bc.swapped(F, "layer_norm", layer_norm) if policy == "cuda" else contextlib.nullcontext()


def profile_model_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "32",
                       policy: str = "cuda") -> dict[str, Any]:  # fmt: skip
    """One forward, loss and backward of `model` outside the loop (no optimizer, no data): summarise() of it."""
    amp = {"32": None, "bf16-mixed": torch.bfloat16}[precision]
    model.train()
    with autocast_rules(policy), profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        bc.mark(MARK)
        with record_function(FORWARD):
            with torch.autocast("cpu", dtype=amp) if amp is not None else contextlib.nullcontext():
                pred = model(x)
                with record_function(LOSS):
                    loss = model.loss(pred, y)  # type: ignore[operator]
        loss.backward()
        bc.mark(MARK)
    return summarise(*step_window(prof.events()))


def profile_loop(task: Any, a: Any) -> tuple[list[Any], int]:
    """plainloop's Trainer on `task`: a.warmup steps, then a.steps profiled ones, one mark at every step end."""
    from trainer import Callback, TrainConfig, Trainer

    w, first, last = bc.Window(torch.device("cpu"), with_stack=True), a.warmup, a.warmup + a.steps

    class Marks(Callback):
        def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
            if trainer.progress.step == first:
                w.start()
            w.mark(MARK)
            if trainer.progress.step == last:
                w.stop()

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        for obj, name, label in ((task.model, "forward", FORWARD), (task.model, "loss", LOSS),
                                 (task.train_set, "gather", DATA)):  # fmt: skip
            stack.enter_context(bc.labelled(obj, name, label))
        stack.enter_context(autocast_rules(a.policy))
        cfg = TrainConfig(max_steps=last + 1, batch_size=a.batch, output_dir=tmp, run_name="op_count", seed=a.seed,
                          device="cpu", precision=a.precision, validation_interval=10**6, progress_bar=False,
                          save_best=False, summary=False)  # fmt: skip
        with bc.quiet():
            Trainer(cfg, task, log=lambda _s: None, callbacks=[Marks()]).fit()
    return step_window(w.prof.events())


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
    from tasks.era5 import build_era5_task

    a = bc.parser(__doc__, FLAGS).parse_args(argv)
    torch.manual_seed(a.seed)
    with bc.quiet():
        task = build_era5_task(d_model=a.d_model, num_heads=8, num_layers=3, dim_feedforward=2 * a.d_model,
                               recursion_depth=2, dropout=0.1, seq_len=2, resolution=a.resolution,
                               calendar=not a.no_calendar, prior=a.prior, ensemble=a.ensemble, seed=a.seed,
                               data_path=a.data_path, cache_dir=a.cache_dir)  # fmt: skip
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

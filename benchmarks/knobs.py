"""What channels_last and deterministic mode cost or gain: training steps of the SST and re-ID models, side by side.

    .venv/bin/python -m benchmarks.knobs                      # ~2 min on 2 shared CPU cores
    .venv/bin/python -m benchmarks.knobs --steps 40 --repeats 5

Each configuration trains a fresh copy of the same model on the same batches (forward, backward, AdamW step) with
one knob changed: `default`, `channels_last` (trainer/knobs.py: 4-D weights and batches in NHWC) and
`deterministic` (torch.use_deterministic_algorithms(True)). Repetitions are interleaved (the machine is shared);
the table reports the median samples/s and its ratio to `default`. Models: the RecursiveAttentionTransformer at the
CPU demo's size and grid (no convolutions: its 4-D input is reshaped into patches) and the re-ID ReIDNet
(convolutions + BatchNorm) on the synthetic set's 32 x 16 images. On a CPU this measures oneDNN's kernels only.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import RESULTS_DIR, command, environment, md_table, parser, stats, wait_for_quiet, write_result
from trainer.knobs import channels_last, to_channels_last

CONFIGS = ("default", "channels_last", "deterministic")
FLAGS = [("--steps", 20, "timed steps per repetition"), ("--warmup", 3, "untimed steps first"),
         ("--repeats", 3, "interleaved repetitions"), ("--threads", 1, "torch threads (the CPU demo's setting)"),
         ("--max_load", 2.5, "wait for a 1-minute load average below this"),
         ("--max_wait", 300.0, "seconds to wait for it at most"),
         ("--out", str(RESULTS_DIR / "knobs_cpu.json"), "raw JSON (and .md beside it)")]  # fmt: skip
Case = tuple[nn.Module, Callable[[nn.Module, Any], torch.Tensor], list[Any]]


def sst_case(batch: int) -> Case:
    from models.ratransformer import RecursiveAttentionTransformer
    from tasks.era5 import CPU_PRESET

    torch.manual_seed(0)
    h, w, seq = 33, 72, int(CPU_PRESET["seq_len"])  # 5 deg over 80S-80N, all longitudes
    keys = ("d_model", "num_heads", "num_layers", "dim_feedforward", "recursion_depth")
    sizes: dict[str, Any] = {k: CPU_PRESET[k] for k in keys}
    model = RecursiveAttentionTransformer(width=w, height=h, seq_len=seq, dropout=0.0, **sizes)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, seq - 1, h, w, generator=g), torch.randn(batch, h, w, generator=g))
               for _ in range(4)]  # fmt: skip
    return model, lambda m, b: F.mse_loss(m(b[0]), b[1]), batches


def reid_case(batch: int) -> Case:
    from models.reid_net import ReIDLoss, ReIDNet

    torch.manual_seed(0)
    model, crit, g = ReIDNet(num_classes=256, width=32), ReIDLoss(), torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, 3, 32, 16, generator=g), torch.arange(batch) // 4) for _ in range(4)]
    return model, lambda m, b: crit(m(b[0]), b[1]), batches


def run_config(name: str, case: Case, steps: int, warmup: int) -> float:
    """Samples/s of `steps` training steps after `warmup` untimed ones, with knob `name`."""
    base, loss_fn, batches = case
    model, move = copy.deepcopy(base), (lambda b: b)
    if name == "channels_last":
        channels_last(model, torch.device("cpu"))
        move = to_channels_last
    torch.use_deterministic_algorithms(name == "deterministic")
    try:
        opt, t0 = torch.optim.AdamW(model.parameters(), lr=1e-3), 0.0
        model.train()
        for i in range(warmup + steps):
            t0 = time.perf_counter() if i == warmup else t0
            loss = loss_fn(model, move(batches[i % len(batches)]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return steps * batches[0][0].shape[0] / (time.perf_counter() - t0)
    finally:
        torch.use_deterministic_algorithms(False)


def main(argv: list[str] | None = None) -> None:
    a = parser(__doc__, FLAGS).parse_args(argv)
    torch.set_num_threads(a.threads)
    quiet = wait_for_quiet(a.max_load, a.max_wait)
    cases = {"sst (RecursiveAttentionTransformer, batch 16)": sst_case(16), "reid (ReIDNet, batch 32)": reid_case(32)}
    raw: dict[str, dict[str, list[float]]] = {c: {k: [] for k in CONFIGS} for c in cases}
    for r in range(a.repeats):
        for cname, case in cases.items():
            for k in CONFIGS:
                raw[cname][k].append(run_config(k, case, a.steps, a.warmup))
                print(f"[knobs] rep {r + 1} {cname} {k}: {raw[cname][k][-1]:.1f} samples/s", flush=True)
    rows, summary = [], dict[str, dict[str, Any]]()
    for cname, by in raw.items():
        for k, v in by.items():
            # each repetition's ratio to the default run just before it: slow drifts of the machine's load cancel
            st, pr = stats(v), stats([x / d for x, d in zip(v, by["default"])])
            summary.setdefault(cname, {})[k] = {"median_samples_per_s": st["median"], "spread": st["spread"],
                                                "paired_ratio_median": pr["median"],
                                                "paired_ratio_range": [pr["min"], pr["max"]]}  # fmt: skip
            rows.append([cname, k, f"{st['median']:.1f}", f"{st['spread']:.0%}",
                         f"{pr['median']:.2f}x ({pr['min']:.2f}-{pr['max']:.2f})"])  # fmt: skip
    env, cmd = environment(torch.device("cpu")), command("knobs", argv).strip()
    load_after = env["loadavg"]
    table = md_table(["model", "knob", "samples/s (median)", "spread (max-min)/median", "vs default, paired (range)"],
                     rows)  # fmt: skip
    md = (f"# channels_last and deterministic on a CPU\n\nCommand: `{cmd}`; {a.repeats} interleaved repetitions of "
          f"{a.steps} steps, {a.threads} torch thread(s), torch {torch.__version__}; load average {quiet['loadavg']} "
          f"at the start, {load_after} at the end ({env['cpu_count']} cores).\n\n{table}\n\nPaired: the median over "
          "repetitions of each run's samples/s over the default run's in the same repetition; a range that straddles "
          "1.00 is no measured difference. CPU kernels only: cuDNN's NHWC tensor-core convolutions and CUDA's "
          "deterministic kernels are not measured here.\n")  # fmt: skip
    result = {"environment": env, "command": cmd, "config": vars(a), "load": {"start": quiet, "end": load_after},
              "repetitions": raw, "summary": summary}  # fmt: skip
    print(f"[knobs] written {write_result(a.out, result, md)}")


if __name__ == "__main__":
    main()

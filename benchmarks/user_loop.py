"""An in-memory dataset of the nanoGPT kind (token windows cut from one tensor): plainloop vs a hand loop, and where
loader workers start to pay off (the threshold behind `num_workers` auto = 0 for cheap in-memory datasets).

Part 1, end to end: the same tiny GPT, data and steps, trained by (a) a hand loop (DataLoader, 0 workers, the
model's AdamW), (b) plainloop with num_workers left to auto, (c) plainloop with 1 worker. Part 2, the crossover:
the same training step fed by a DataLoader with 0 or 1 workers while each sample costs an extra c microseconds to
produce. One thread, interleaved repetitions, medians.

    python -m benchmarks.user_loop            # ~3 min on 2 cores
    python -m benchmarks.user_loop --quick    # a smoke run
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import RESULTS_DIR, environment, parser, stats, write_result

FLAGS = [("--reps", 5, "interleaved repetitions"), ("--steps", 80, "optimizer steps per run"),
         ("--batch", 32, "batch size"), ("--costs", "0,20,100", "extra microseconds per sample, part 2"),
         ("--quick", False, "smoke run: 1 repetition, 20 steps, costs 0,30"),
         ("--out", str(RESULTS_DIR / "user_loop_cpu.json"), "raw JSON (and .md beside it)")]  # fmt: skip


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """nanoGPT's get_batch as a Dataset: (tokens[i:i+T], tokens[i+1:i+T+1]); `cost_us` of extra work per sample."""

    def __init__(self, n_tokens: int = 200_000, block: int = 64, vocab: int = 64, cost_us: float = 0.0) -> None:
        self.tokens = torch.randint(0, vocab, (n_tokens,), generator=torch.Generator().manual_seed(0))
        self.block, self.cost = block, cost_us * 1e-6

    def __len__(self) -> int:
        return len(self.tokens) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cost:
            end = time.perf_counter() + self.cost
            while time.perf_counter() < end:  # stands for decoding / augmenting one sample
                pass
        return self.tokens[i : i + self.block], self.tokens[i + 1 : i + 1 + self.block]


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 64, block: int = 64) -> None:
        super().__init__()
        self.emb, self.pos, self.head = nn.Embedding(vocab, d), nn.Embedding(block, d), nn.Linear(d, vocab)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        t, mask = idx.shape[1], self.mask
        assert isinstance(mask, torch.Tensor)
        logits = self.head(self.blocks(self.emb(idx) + self.pos.weight[:t], mask=mask[:t, :t], is_causal=True))
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             device_type: str) -> torch.optim.Optimizer:  # fmt: skip
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)


def hand_loop(ds: Dataset[Any], steps: int, batch: int, workers: int) -> float:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    t0 = time.perf_counter()
    for _, (x, y) in zip(range(steps), loader):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def plainloop(ds: Dataset[Any], steps: int, batch: int, workers: int | None) -> tuple[float, int]:
    from trainer import Task, TrainConfig, Trainer

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(max_steps=steps, batch_size=batch, num_workers=workers, progress_bar=False, output_dir=tmp,
                          run_name="run", precision="32", log_every=50, weight_decay=0.1, lr=1e-3,
                          adam_betas=(0.9, 0.95))  # fmt: skip
        t0 = time.perf_counter()
        tr = Trainer(cfg, Task("gpt", TinyGPT(), ds), log=lambda s: None)
        tr.fit()
        return time.perf_counter() - t0, int(tr.data.loader_kw.get("num_workers", 0))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trainer.usercode import CHEAP_S_PER_SAMPLE, in_memory_cost

    a = parser(__doc__, FLAGS).parse_args(argv)
    if a.quick:
        a.reps, a.steps, a.costs = 1, 20, "0,30"
    torch.set_num_threads(1)
    ds = Windows()
    cost, auto_workers = in_memory_cost(ds), None
    e2e: dict[str, list[float]] = {"hand loop (0 workers)": [], "plainloop (auto)": [], "plainloop (1 worker)": []}
    for r in range(a.reps):
        for name in list(e2e) if r % 2 == 0 else list(e2e)[::-1]:
            if name.startswith("hand"):
                e2e[name].append(hand_loop(ds, a.steps, a.batch, 0))
            else:
                s, w = plainloop(ds, a.steps, a.batch, None if "auto" in name else 1)
                e2e[name].append(s)
                auto_workers = w if "auto" in name else auto_workers
            print(f"  {name}: {e2e[name][-1]:.2f} s")
    cross: dict[str, dict[str, list[float]]] = {}
    for c in (float(c) for c in a.costs.split(",")):
        dsc, d = Windows(cost_us=c), cross.setdefault(str(c), {"0": [], "1": []})
        for r in range(a.reps):
            for wk in ("0", "1") if r % 2 == 0 else ("1", "0"):
                d[wk].append(hand_loop(dsc, a.steps, a.batch, int(wk)))
        print(f"  +{c:g} us/sample: 0 workers {min(d['0']):.2f} s, 1 worker {min(d['1']):.2f} s")
    hands = e2e["hand loop (0 workers)"]
    paired = {k: stats([x / h for x, h in zip(v, hands)]) for k, v in e2e.items()}  # same repetition, same load
    cross_ratio = {c: stats([b / a for a, b in zip(d["0"], d["1"])]) for c, d in cross.items()}
    env = environment(torch.device("cpu"))
    result: dict[str, Any] = {
        "benchmark": "user_loop", "env": env,
        "config": {"reps": a.reps, "steps": a.steps, "batch": a.batch, "threads": 1,
                   "costs_us": [float(c) for c in cross]},
        "index_cost_s_per_sample": cost, "cheap_threshold_s_per_sample": CHEAP_S_PER_SAMPLE,
        "auto_num_workers": auto_workers, "end_to_end_s": {k: stats(v) for k, v in e2e.items()},
        "end_to_end_ratio_to_hand_loop": paired, "crossover_ratio_1_worker_over_0": cross_ratio,
        "crossover_s": {c: {w: stats(v) for w, v in d.items()} for c, d in cross.items()},
    }  # fmt: skip

    def ratio(r: dict[str, float]) -> str:
        return f"{r['median']:.2f}x ({r['min']:.2f} - {r['max']:.2f})"

    md = ("# An in-memory dataset: plainloop vs a hand loop, and when loader workers pay off (CPU)\n\n"
          f"`python -m benchmarks.user_loop` on {env['cpu']} ({env['cpu_count']} cores, 1 torch thread), torch "
          f"{env['torch']}, commit {str(env['commit'])[:12]}; a 2-layer GPT (d 64, block 64, batch {a.batch}), "
          f"{a.steps} steps, {a.reps} interleaved repetitions. Indexing this dataset costs {(cost or 0) * 1e6:.1f} us "
          f"per sample (measured at start-up); auto picked {auto_workers} worker(s).\n\n"
          "| loop | seconds (median) | vs hand loop, paired by repetition (median, min - max) |\n|---|---|---|\n"
          + "".join(f"| {k} | {stats(v)['median']:.2f} | {ratio(paired[k])} |\n" for k, v in e2e.items())
          + "\nThe same step fed with 0 or 1 loader workers while each sample costs c more microseconds:\n\n"
          "| extra cost per sample | 0 workers (s) | 1 worker (s) | 1 worker / 0 workers, paired (median, min - max) |"
          "\n|---|---|---|---|\n"
          + "".join(f"| {float(c):g} us | {stats(d['0'])['median']:.2f} | {stats(d['1'])['median']:.2f} | "
                    f"{ratio(cross_ratio[c])} |\n" for c, d in cross.items())
          + f"\n1-minute load average when the run ended: {env['loadavg']} (a shared machine: read the paired "
          "ratios).\n")  # fmt: skip
    write_result(a.out, result, md)
    return result


if __name__ == "__main__":
    main()

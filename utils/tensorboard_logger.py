"""TensorBoard for a training run: a callback that mirrors every metrics.jsonl row into TensorBoard event files.

    from utils.tensorboard_logger import TensorBoardLogger
    callbacks = [TensorBoardLogger()]        # what `--logger tensorboard` plugs into the loop
    tensorboard --logdir runs/               # each run directory shows up as one run

The loop's callback interface (trainer/hooks.py) is matched by method names only, so this file imports
nothing from the trainer: `on_fit_start(trainer)` opens the writer in `trainer.run_dir` (or the `log_dir`
given) and stores config.json as text; `on_log(trainer, row)` writes each row's numbers as scalars —
train/loss, train/lr, train/samples_per_s, train/data_wait_frac, train/grad_norm, train/skipped_steps (every
numeric key of a "train" or "norm" row, under train/), and val/<metric> for a "val" row (val_rmse_c ->
val/rmse_c, rgb2ir_mAP -> val/rgb2ir_mAP); "event" and "checkpoint" rows become text under "events".
`on_fit_end(trainer, summary)` adds the test scores (test/...), the verdict as text and, when
RUN_DIR/test_month.npz exists, the test-month figure (utils/plot.py), then closes the files. Validation metrics that come with baselines (val_persistence_rmse_c, ...) or in two
directions (rgb2ir_/ir2rgb_) are also grouped on one chart each in TensorBoard's "Custom Scalars" tab.

Optional dependency: `pip install tensorboard` (torch.utils.tensorboard writes the files; the figure also
needs matplotlib). Without it the constructor raises ImportError naming the package and the pip command, so
the run stops at start-up, not after its first epoch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardLogger", "MISSING_MESSAGE"]

MISSING_MESSAGE = (
    "TensorBoard logging (--logger tensorboard) needs the `tensorboard` package, which is not installed: "
    "pip install tensorboard (or run without --logger tensorboard; metrics.jsonl is always written)"
)
_SKIP = {"kind", "step", "epoch", "time"}
# Custom Scalars charts: a validation metric family (by key suffix), drawn as one multi-line chart
_FAMILIES = (("RMSE (°C)", "rmse_c"), ("ACC", "acc"), ("mAP", "mAP"), ("rank-1", "rank1"))


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch says "TensorBoard logging requires TensorBoard version 1.15 or above"
        raise ImportError(MISSING_MESSAGE) from e
    return SummaryWriter


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


class TensorBoardLogger:
    """A loop callback writing scalars, text and the SST test-month figure for TensorBoard.

    Args:
        log_dir: where the event files go; None (default) = the run directory, so `tensorboard --logdir
            runs/` lists runs by their names.
        flush_secs: how often pending events reach the disk (TensorBoard shows what is on disk); every
            validation row is flushed at once regardless.
    """

    def __init__(self, log_dir: str | Path | None = None, flush_secs: float = 10.0) -> None:
        if not flush_secs > 0:
            raise ValueError(f"TensorBoardLogger(flush_secs={flush_secs!r}): must be > 0 seconds")
        self._writer_cls = _summary_writer()
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = float(flush_secs)
        self.log_dir: Path | None = None
        self.writer: Any = None
        self.last_step = 0
        self._layout_done = False

    # ---- the loop's hooks
    def on_fit_start(self, trainer: Any) -> None:
        run_dir = Path(trainer.run_dir)
        self.log_dir = self._log_dir or run_dir
        # a resumed run redoes the steps after its checkpoint: their events from before a kill are purged, as
        # metrics.jsonl moves their rows aside (TensorBoard drops events at or after purge_step)
        step = int(getattr(trainer, "step", 0) or 0)
        purge = {"purge_step": step + 1} if step > 0 else {}
        self.writer = self._writer_cls(log_dir=str(self.log_dir), flush_secs=self.flush_secs, **purge)
        cfg = run_dir / "config.json"
        if cfg.is_file():
            text = cfg.read_text(encoding="utf-8")
            self.writer.add_text("config", "```json\n" + text + "\n```", 0)  # Markdown: keep it verbatim
        self.writer.flush()

    def on_log(self, trainer: Any, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        kind, step = row.get("kind"), row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        self.last_step = max(self.last_step, step)
        t = _number(row.get("time"))
        walltime = t if t is not None and t > 1e9 else None  # a Unix time; anything else: now
        if kind in ("train", "norm"):
            for k, v in row.items():
                x = _number(v)
                if k not in _SKIP and x is not None:
                    self.writer.add_scalar(f"train/{k}", x, step, walltime=walltime)
        elif kind == "val":
            keys = []
            for k, v in row.items():
                x = _number(v)
                if k not in _SKIP and x is not None:
                    # val_loss -> val/loss; the EMA's raw scores raw_val_loss -> val/raw_loss
                    name = k[4:] if k.startswith("val_") else k.replace("raw_val_", "raw_", 1)
                    keys.append(name)
                    self.writer.add_scalar(f"val/{name}", x, step, walltime=walltime)
            self._add_layout(keys)
            self.writer.flush()  # a validation is what one waits for: show it now
        elif kind in ("event", "checkpoint"):
            msg = {k: v for k, v in row.items() if k not in ("kind", "step")}
            self.writer.add_text("events", f"step {step}: `{json.dumps(msg, default=str)}`", step, walltime=walltime)

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        if self.writer is None:
            return
        step = summary.get("steps") if isinstance(summary.get("steps"), int) else self.last_step
        for k, v in (summary.get("final_metrics") or {}).items():
            x = _number(v)
            if k.startswith("test_") and x is not None:
                self.writer.add_scalar(f"test/{k[5:]}", x, step)
        verdict = summary.get("verdict")
        if isinstance(verdict, dict) and verdict.get("verdict"):
            lines = [f"**{verdict.get('headline') or verdict['verdict']}**", ""]
            lines += [f"- {e}" for e in verdict.get("evidence", [])]
            if verdict.get("advice"):
                lines += ["", f"Advice: {verdict['advice']}"]
            self.writer.add_text("verdict", "\n".join(lines), step)
        info: dict[str, Any] = {"log_dir": str(self.log_dir)}
        npz = Path(trainer.run_dir) / "test_month.npz"
        if npz.is_file():
            try:
                from utils.plot import map_figure

                fig = map_figure(npz, Path(trainer.run_dir).name)
                self.writer.add_figure("test/month_maps", fig, step)  # closes the figure
                info["figure"] = "test/month_maps"
            except (ImportError, ValueError, OSError) as e:  # a figure is never worth losing the run's logs
                info["figure_error"] = str(e)
                self.writer.add_text("test/month_maps", f"figure not drawn: {e}", step)
        summary["tensorboard"] = info
        self.close()

    # ---- helpers
    def _add_layout(self, keys: list[str]) -> None:
        """One Custom Scalars chart per metric family with more than one line (model + baselines, or both
        re-ID directions); written once, at the first validation."""
        if self._layout_done:
            return
        self._layout_done = True
        charts = {}
        for title, suffix in _FAMILIES:
            tags = [f"val/{k}" for k in keys if k == suffix or k.endswith("_" + suffix)]
            if len(tags) > 1:
                charts[title] = ["Multiline", tags]
        if charts:
            self.writer.add_custom_scalars({"validation": charts})

    def close(self) -> None:
        """Flush and close the event files (idempotent)."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None

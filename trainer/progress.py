"""What a person watching the run sees: one run-level progress bar and one line per epoch checkpoint.

The bar shows only when its stream (stderr) is a terminal; piped or redirected, the epoch lines stand alone.

The bar is refreshed every `progress_every` batches and at every epoch end, and shows the figures of the last
log point (never forcing a read-back of its own); tqdm adds the ETA. Lines go through tqdm.write so the bar stays.
"""

from __future__ import annotations

import math
import time
from typing import Any

try:
    from tqdm.auto import tqdm
except ImportError:  # tqdm is a runtime dependency, but a copied engine still runs without it
    tqdm = None


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


def open_bar(self: Any) -> None:
    if tqdm is not None and self.cfg.progress_bar and self.rt.is_main:
        total = min(self.max_epochs * self.batches_per_epoch, self.total_steps * self.cfg.accumulate_grad_batches)
        self.bar = tqdm(
            total=total,
            initial=self.batches_total_done(),
            desc="train",
            dynamic_ncols=True,
            mininterval=0.5,
            unit="batch",
            disable=None,  # off when its stream (stderr) is not a terminal: piped to a file, redraws would interleave
        )


def epoch_line(self: Any, t0: float) -> None:
    """One line per epoch checkpoint: where the run is, its last logged figures, and the time left."""
    row, done = self.last_row, self.batches_total_done()
    total = min(self.max_epochs * self.batches_per_epoch, self.total_steps * self.cfg.accumulate_grad_batches)
    ran = done - self._start_batches
    eta = (time.perf_counter() - t0) / ran * (total - done) if ran > 0 else float("nan")
    # self.epoch counts finished epochs; stopped mid-epoch (max_steps, a signal) the run is inside the next one
    epoch = self.epoch + (1 if self.batches_done else 0)
    self.log(
        f"[epoch {epoch}/{self.max_epochs}] step {self.step}/{self.total_steps}: loss "
        f"{row.get('loss', float('nan')):.4g}, {row.get('samples_per_s', 0):.0f} samples/s, data wait "
        f"{100 * row.get('data_wait_frac', 0):.0f}%, ETA {_hms(eta)}; last.pt saved"
    )

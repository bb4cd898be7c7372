"""What a person watching the run sees: one run-level progress bar and one line per epoch checkpoint.

The bar shows only when its stream (stderr) is a terminal; piped or redirected, the epoch lines stand alone.

The bar is refreshed every `progress_every` batches and at every epoch end, and shows the figures of the last
log point (never forcing a read-back of its own); tqdm adds the ETA. Lines go through tqdm.write so the bar stays.
"""

from __future__ import annotations

import math
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


def open_bar(enabled: bool, total: int | None, initial: int) -> Any:
    """The run-level bar; None without tqdm, when switched off, or when stderr is not a terminal (tqdm's choice)."""
    if tqdm is None or not enabled:
        return None
    bar = tqdm(
        total=total, initial=initial, desc="train", dynamic_ncols=True, mininterval=0.5, unit="batch", disable=None
    )
    if getattr(bar, "disable", False):  # never shown: no bar, so log points and epoch ends update no hidden one
        bar.close()
        return None
    return bar


def epoch_line(
    *,
    epoch: int,
    max_epochs: int | None,  # None: not known (a stream's passes)
    step: int,
    total_steps: int | None,
    row: dict[str, Any],
    eta_s: float,
    extra: tuple[str, ...] = (),
    saved: str = "",
) -> str:
    """One line per epoch: where the run is, its last logged figures (and the `extra` names of the row: what the
    model's self.log gave), the time left, and `saved` when last.pt was written with it."""
    where = f"[epoch {epoch}/{max_epochs or '?'}] step {step}/{total_steps or '?'}: "
    if "loss" not in row:  # stopped before the first log point: no loss was read, and none is made up
        return f"{where}no loss logged yet, ETA {_hms(eta_s)}" + (f"; {saved}" if saved else "")
    more = "".join(f", {k} {row[k]:.4g}" for k in extra if isinstance(row.get(k), int | float))
    at = f" (at step {row['step']})" if row.get("step", step) != step else ""  # stopped between two log points
    return (
        f"{where}loss {row['loss']:.4g}{at}{more}, {row.get('samples_per_s', 0):.0f} samples/s, data wait "
        f"{100 * row.get('data_wait_frac', 0):.0f}%, ETA {_hms(eta_s)}" + (f"; {saved}" if saved else "")
    )

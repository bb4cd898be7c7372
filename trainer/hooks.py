"""What the loop reports to, handed in from outside: callbacks with do-nothing defaults.

The engine imports nothing from the rest of plainloop. The CLI plugs in the TrainingMonitor, the
bottleneck verdict, TensorBoard and plots through these hooks; a user's own repo plugs in its own.
A callback is any object with some of the methods below (duck-typed: subclassing `Callback` is optional),
called on rank 0 only, never per step except `on_step`, which must stay cheap and must not sync the device.
"""

from __future__ import annotations

from typing import Any


class Callback:
    def on_fit_start(self, trainer: Any) -> None:
        """After the run directory and config.json exist, before the first step."""

    def on_log(self, trainer: Any, row: dict[str, Any]) -> None:
        """Every row written to metrics.jsonl: kind "train" (loss, lr, samples/s ...), "val", "norm", "event"."""

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        """After training and testing, before summary.json is written; may add keys to `summary`."""


class Monitor:
    """The per-iteration timing sink (seed 001's TrainingMonitor has this API). The default does nothing."""

    def start_monitoring(self) -> None: ...

    def log_iteration(self, seconds: float, data_seconds: float | None = None, samples: int | None = None) -> None: ...

    def stop_monitoring(self) -> None: ...

    def get_summary(self) -> dict[str, Any]:
        return {}


def call(callbacks: list[Any], name: str, *args: Any) -> None:
    """Call `name` on every callback that defines it."""
    for cb in callbacks:
        fn = getattr(cb, name, None)
        if fn is not None:
            fn(*args)

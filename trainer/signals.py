"""Stop requests: SIGTERM (pre-emption, `docker stop`), SIGINT (Ctrl-C), SIGUSR1 (SLURM's --signal warning) and
SIGHUP (the terminal closed or the ssh session dropped; torchrun forwards it to its workers too).

The first signal only sets a flag; the loop finishes the current step, writes last.pt and exits with 128 +
the signal number. A second Ctrl-C stops at once (KeyboardInterrupt), without writing anything more. A signal the
process was started with ignored (`nohup` ignores SIGHUP) stays ignored: plainloop never installs a handler for it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import torch
import torch.distributed as dist

from .runtime import Runtime

# what signal.signal takes and gives back: a function, SIG_DFL/SIG_IGN, or None (set outside Python)
Handler = Callable[[int, FrameType | None], object] | int | None

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP") if hasattr(signal, n))
# the stop signals this process was started with ignored (nohup: SIGHUP; a background job of a script: SIGINT)
IGNORED_AT_START = frozenset(s for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)


def handled_signals() -> tuple[int, ...]:
    """The stop signals plainloop may handle: those not ignored when the process started, nor ignored now."""
    return tuple(s for s in STOP_SIGNALS if s not in IGNORED_AT_START and signal.getsignal(s) != signal.SIG_IGN)


class StopNow(BaseException):
    """Raised by a StopRequest's handler when its `at_once()` says the work under way need not finish."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class StopRequest:
    """Context manager that turns stop signals into a flag the loop polls (a Python attribute: no sync).

    at_once: when it returns True at a signal, the handler raises StopNow instead (nothing left to save)."""

    def __init__(self, at_once: Callable[[], bool] | None = None) -> None:
        self.signum: int | None = None
        self.at_once = at_once
        self._old: dict[int, Handler] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for s in handled_signals():
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if self.signum is None:
            self.signum = signum
        if self.at_once is not None and self.at_once():
            raise StopNow(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def agree_stop(request: StopRequest, rt: Runtime) -> int | None:
    """The stop every rank acts on: the live flag (a handler may set it at any moment) on one process; under DDP
    the ranks' flags all-reduced, so they all take the same branch. A collective: every rank calls it together."""
    signum = request.signum
    if rt.distributed:
        flag = torch.tensor(float(signum or 0), device=rt.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        signum = int(flag.item()) or None  # note: sync point (log points, epoch ends, validations)
        request.signum = request.signum or signum  # a rank that was not signalled names the signal too
    return signum


def ignore_stop_signals(worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: loader workers ignore stop signals and leave them to the training process.

    torchrun passes a SIGTERM/SIGINT to each rank's whole process group, and SLURM signals every process of a job
    step: a worker killed by it crashed its rank ("DataLoader worker ... is killed by signal") before that rank could
    write last.pt. The training process ends its workers itself; a worker whose parent dies exits on its own.
    """
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)

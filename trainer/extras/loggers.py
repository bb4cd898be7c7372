"""Loggers: callbacks that mirror every metrics.jsonl row into a CSV file or Weights & Biases.

    from trainer import CSVLogger, WandbLogger      # the module: trainer.extras.loggers
    Trainer(cfg, task, callbacks=[CSVLogger(), WandbLogger(project="sst")]).fit()
    python train_optimized.py --logger csv,wandb,tensorboard            # the same from the command line

Each logger gets the run's configuration in `on_fit_start` (RUN_DIR/config.json, written just before), every row
of metrics.jsonl in `on_log` (kinds "train", "norm", "val", "event"; the "checkpoint" notices that
metrics.jsonl does not keep are skipped), and the summary in `on_fit_end`. They run on rank 0 only.
The TensorBoard logger lives in utils/tensorboard_logger.py (it draws the SST figure, which needs plainloop's
plotting code) and plugs in the same way.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from ..hooks import TrainerView

Mode = Literal["online", "offline", "disabled"]

LOGGERS = ("csv", "tensorboard", "wandb")  # what --logger accepts ("jsonl" alone: metrics.jsonl only, always on)
WANDB_MISSING = (
    "--logger wandb needs the `wandb` package, which is not installed: pip install wandb (or leave wandb out of "
    "--logger; metrics.jsonl is always written)"
)
_FIRST = ("kind", "step", "epoch")  # leading CSV columns; the others follow in order of first appearance


class WandbSummary(Protocol):
    """A run's summary: the test scores and totals shown with the run."""

    def __setitem__(self, key: str, value: object) -> None: ...


class WandbRun(Protocol):
    """What the logger uses of the run `wandb.init` returns."""

    @property
    def summary(self) -> WandbSummary: ...

    def define_metric(self, name: str, step_metric: str | None = None) -> object: ...

    def log(self, data: dict[str, float]) -> None: ...

    def finish(self) -> None: ...


def parse_logger_names(value: str | list[str] | tuple[str, ...] | None, flag: str = "--logger") -> tuple[str, ...]:
    """'csv,wandb' (or a list) -> ("csv", "wandb"); "jsonl" or empty = none; an unknown name is a ValueError."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = []
    for p in (x.strip().lower() for x in parts):
        if p in ("", "jsonl", "none"):
            continue
        if p not in LOGGERS:
            raise ValueError(
                f"{flag} {value if isinstance(value, str) else ','.join(parts)}: unknown logger {p!r}; use a comma "
                f"list of {', '.join(LOGGERS)} (metrics.jsonl is always written), e.g. {flag} csv,tensorboard"
            )
        if p not in names:
            names.append(p)
    return tuple(names)


def read_config(run_dir: Path) -> dict[str, object]:
    """The run's configuration as the loop wrote it (RUN_DIR/config.json); {} when there is none."""
    try:
        cfg = json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def flatten(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _cell(v: object) -> object:
    if v is None:
        return ""
    if isinstance(v, list | tuple | dict):
        return json.dumps(v, default=str)
    return v


class CSVLogger:
    """RUN_DIR/metrics.csv: one line per metrics.jsonl row (columns: the union of the rows' keys), and
    RUN_DIR/config.csv: the configuration as key,value lines.

    A row with a key not seen before rewrites the file with the wider header (a handful of times per run: the
    first norm row, the first validation). On a resume the file is rebuilt from metrics.jsonl, whose rows after
    the checkpoint were rolled back, so both files always hold the same rows.
    """

    def __init__(self, filename: str = "metrics.csv") -> None:
        self.filename = filename
        self.path: Path | None = None
        self.columns: list[str] = []
        self.rows: list[dict[str, object]] = []

    def on_fit_start(self, trainer: TrainerView) -> None:
        run_dir = _run_dir(trainer)
        self.path = run_dir / self.filename
        config = flatten(read_config(run_dir))
        _write_csv(run_dir / "config.csv", ["key", "value"], [{"key": k, "value": v} for k, v in config.items()])
        self.rows = []
        jsonl = run_dir / "metrics.jsonl"
        if jsonl.is_file():  # a resume: the rows kept so far
            for line in jsonl.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    self.rows.append(row)
        self.columns = []
        for row in self.rows:
            self._add_columns(row)
        self._rewrite()

    def on_log(self, trainer: TrainerView, row: dict[str, object]) -> None:
        if self.path is None or row.get("kind") == "checkpoint":
            return
        self.rows.append(dict(row))
        if self._add_columns(row):
            self._rewrite()
            return
        with open(self.path, "a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, self.columns).writerow({k: _cell(row.get(k)) for k in self.columns})

    def _add_columns(self, row: dict[str, object]) -> bool:
        new = [k for k in row if k not in self.columns]
        if not new:
            return False
        cols = self.columns + new
        self.columns = [k for k in _FIRST if k in cols] + [k for k in cols if k not in _FIRST]
        return True

    def _rewrite(self) -> None:
        assert self.path is not None
        _write_csv(self.path, self.columns, [{k: _cell(r.get(k)) for k in self.columns} for r in self.rows])


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, object]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)  # a reader (a spreadsheet, tail) never sees half a file


class WandbLogger:
    """Weights & Biases: the configuration, every numeric value of every row, and the test scores.

    Rows become train/<key> ("train" and "norm" rows) and val/<metric> (val_rmse_c -> val/rmse_c), plotted against
    trainer/step; the test scores go into the run's summary as test/<metric>. Files go to RUN_DIR/wandb. A run
    that is resumed continues the same W&B run (its id is kept in RUN_DIR/wandb_id).

    Offline: WANDB_MODE=offline (or mode="offline") writes everything under RUN_DIR/wandb with no network; upload
    later with `wandb sync RUN_DIR/wandb/offline-run-*`. Without WANDB_MODE, an API key (WANDB_API_KEY or
    `wandb login`) and no other setting, the logger runs offline and says so in one line.

    Args:
        project: the W&B project (default: $WANDB_PROJECT, else "plainloop").
        entity: passed to wandb.init.
        tags: passed to wandb.init.
        group: passed to wandb.init.
        mode: "online", "offline" or "disabled"; None = $WANDB_MODE, else offline without an API key.
    """

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        tags: list[str] | None = None,
        group: str | None = None,
        mode: Mode | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as e:  # said at construction, so the run stops before its first step
            raise ImportError(WANDB_MISSING) from e
        if mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"WandbLogger(mode={mode!r}): use 'online', 'offline' or 'disabled'")
        self.wandb = wandb
        self.project, self.entity, self.tags, self.group, self.mode = project, entity, tags, group, mode
        self.run: WandbRun | None = None

    def _mode(self) -> tuple[Mode | None, str | None]:
        """(mode, note): the mode asked for, or offline with a note when nothing says how to reach W&B."""
        if self.mode or os.environ.get("WANDB_MODE"):
            return self.mode, None
        if os.environ.get("WANDB_API_KEY") or _netrc_has_wandb():
            return None, None
        return "offline", (
            "wandb: no API key (WANDB_API_KEY or `wandb login`), so logging offline into RUN_DIR/wandb; upload "
            "later with `wandb sync`, or set WANDB_MODE=online"
        )

    def on_fit_start(self, trainer: TrainerView) -> None:
        run_dir = _run_dir(trainer)
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else None
        mode, note = self._mode()
        if note:
            trainer.log(f"[plainloop] {note}")
        self.run = self.wandb.init(
            project=self.project or os.environ.get("WANDB_PROJECT") or "plainloop",
            entity=self.entity,
            name=run_dir.name,
            group=self.group,
            tags=self.tags,
            dir=str(run_dir),
            config=read_config(run_dir),
            id=run_id,
            resume="allow" if run_id else None,
            mode=mode,
        )
        if run_id is None and (new_id := getattr(self.run, "id", None)):
            id_file.write_text(str(new_id), encoding="utf-8")
        self.run.define_metric("trainer/step")
        self.run.define_metric("*", step_metric="trainer/step")

    def on_log(self, trainer: TrainerView, row: dict[str, object]) -> None:
        if self.run is None:
            return
        kind, step = row.get("kind"), row.get("step")
        if kind not in ("train", "norm", "val") or not isinstance(step, int):
            return  # events and checkpoint notices carry text, not numbers (metrics.jsonl keeps them)
        prefix = "val" if kind == "val" else "train"
        data: dict[str, float] = {"trainer/step": step}
        for k, v in row.items():
            if k in ("kind", "step", "time") or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if not math.isfinite(v):
                continue
            name = k[4:] if kind == "val" and k.startswith("val_") else k
            data["trainer/epoch" if k == "epoch" else f"{prefix}/{name}"] = v
        self.run.log(data)

    def on_fit_end(self, trainer: TrainerView, summary: dict[str, object]) -> None:
        if self.run is None:
            return
        final = summary.get("final_metrics")
        for k, v in (final if isinstance(final, dict) else {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool) and k.startswith("test_"):
                self.run.summary[f"test/{k[5:]}"] = v
        for k in ("steps", "train_time_s", "samples_per_s"):
            if isinstance(summary.get(k), int | float):
                self.run.summary[k] = summary[k]
        summary["wandb"] = {"id": getattr(self.run, "id", None), "dir": str(_run_dir(trainer) / "wandb")}
        self.run.finish()
        self.run = None


def _netrc_has_wandb() -> bool:
    """`wandb login` stores the key in ~/.netrc under api.wandb.ai (or $WANDB_BASE_URL's host)."""
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _run_dir(trainer: TrainerView) -> Path:
    """Loggers start with the run (on_fit_start): its directory exists by then."""
    if trainer.run_dir is None:
        raise RuntimeError("a logger was called before the run directory was made")
    return Path(trainer.run_dir)

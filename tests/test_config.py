"""One source of configuration: flags generated from TrainConfig and the task builders, config files, aliases."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

import train_optimized as cli
from tasks import TASK_BUILDERS
from tests.helpers import SMALL
from trainer import TrainConfig
from trainer.cli.options import function_parameters, load_config_file
from trainer.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def flags() -> set[str]:
    actions = cli.build_parser()._actions
    return {a.dest for a in actions if a.option_strings and a.dest != "help"} | {"help_all"}  # --help-all


def test_every_setting_has_a_flag():
    have = flags()
    for f in dataclasses.fields(TrainConfig):
        assert f.name in have, f"TrainConfig.{f.name} has no --flag"
        assert f.metadata.get("help"), f"TrainConfig.{f.name} has no help text"
    for f in dataclasses.fields(cli.RunOptions):
        assert f.name in have
    for name, builder in TASK_BUILDERS.items():
        for p in function_parameters(builder()):
            if p not in ("seed", "device_cache", "learning_rate"):
                assert p in have, f"{name} task parameter {p} has no --flag"


# flags of other programs that the README and the manual quote (pytest, pip, torchrun, benchmarks, the sample maker)
OTHER_PROGRAMS = {
    "index_url",  # README.md: pip's, and mkdocs build --strict
    "strict",
    "hidden",  # docs/guides/extending.md: the example user task's own flags, and timm's --model-ema
    "data_dir",
    "act",
    "model_ema",
    "boxes",  # docs/tasks/sst.md: the skill benchmarks' flags
    "network",
    "network_leads",
    "render",
    "rolling",
    "tag",
    "help",
    "elastic_args",
    "wait_load",
    "wait_max",
    "cache_dir",
    "reps",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "requeue",
    "check",
    "logdir",
    "signal",
    "batch",
    "flag",
    "data",
    "deps",
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "max_restarts",
    "standalone",
    "threads",
    "out",
    "preset",
    "layout",
    "years",
    "grid",
    "file_grid",
    "rerender",
    "loops",
    "quick",
    "seeds",
    "leads",
    "contexts",
    "datasets",
    "dry_run",
    "cases",
    "configs",  # benchmarks/run.py
    "variants",  # benchmarks/checkpoint_cost.py
    "repeats",  # benchmarks/knobs.py
    "max_wait",
    "kills",
    "signals",
    "only",
    "steps",
    "warmup",
    "sizes",
    "top",  # benchmarks.op_count
    "label",
    "policy",
}


def doc_texts() -> dict[str, str]:
    """README.md and every page of the manual (docs/)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def test_every_flag_the_docs_name_exists():
    for name, text in doc_texts().items():
        named = {m.replace("-", "_") for m in re.findall(r"(?<![\w-])--(?:no-)?([a-z][a-z0-9_-]+)", text)}
        missing = sorted(named - flags() - OTHER_PROGRAMS)
        assert not missing, f"{name} names flags that train_optimized.py does not have: {missing}"


def test_the_flag_reference_is_generated_from_the_source():
    """docs/reference/flags.md holds only a marker; the build fills in one table per argparse group."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_flags

    page = (ROOT / "docs" / "reference" / "flags.md").read_text(encoding="utf-8")
    assert docs_flags.MARKER in page
    rendered = docs_flags.render(page)
    assert docs_flags.MARKER not in rendered
    parser = cli.build_parser()
    for a in parser._actions:
        for o in a.option_strings:
            if o.startswith("--") and a.dest not in ("help", "help_all"):
                assert f"`{o}" in rendered or f", {o}`" in rendered, f"{o} is missing from the flag reference"
    groups = [g for g in parser._action_groups if any(a.dest not in ("help", "help_all") for a in g._group_actions)]
    assert rendered.count("\n### ") == len(groups)  # one section per argparse group, as in --help


def test_help_has_groups_and_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help-all"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for group in (
        "optimizer:",
        "data loading:",
        "robustness:",
        "era5 task:",
        "reid task:",
        "measurement tools:",
    ):
        assert group in out
    assert "--min_lr_ratio MIN_LR_RATIO" in out and "(default: 0.05)" in out
    assert "--save_best, --no-save_best" in out and "--d_model D_MODEL" in out and "from --preset" in out


def test_config_file_is_read_and_flags_win(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[train]\nbatch_size = 12\nlr = 0.01\n[task]\nlon = [170.0, -120.0]\n", encoding="utf-8")
    explicit = vars(cli.build_parser().parse_args(["--config", str(f), "--lr", "0.5"]))
    _, task_kw, train_kw = cli.split_settings(cli.resolve_settings(explicit, []))
    assert train_kw["batch_size"] == 12 and train_kw["lr"] == 0.5 and task_kw["lon"] == (170.0, -120.0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch_sise = 12\n", "'batch_sise' (did you mean batch_size"),
        ("[train]\nepochs = 'ten'\n", "epochs='ten': not a whole number; use a whole number >= 1"),
        ("[train]\nepochs = 2.5\n", "epochs=2.5: not a whole number"),
        ("[runner]\nmax_iter = 10\n", "unknown setting runner.max_iter"),
        ("epochs = \n", "not valid TOML"),
    ],
)
def test_bad_config_files_are_clear_errors(tmp_path, capsys, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text, encoding="utf-8")
    try:
        code = cli.main(["--config", str(f)])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and str(f) in err, err


def test_seed002_mmseg_names_are_aliases(capsys):
    notes: list[str] = []
    vals = load_config_file(ROOT / "configs" / "seed002_mmseg.toml", notes)
    assert vals["batch_size"] == 16 and vals["num_workers"] == 1 and vals["max_batches"] == 400
    assert vals["val_check_batches"] == 200 and vals["accumulate_grad_batches"] == 2
    assert (vals["precision"], vals["loss_scale"]) == ("16-mixed", "512.0")
    assert len(notes) == 6 and all(n.startswith("config: mmseg") for n in notes)
    eff = TrainConfig(**vals).effective()  # mmseg iterations are batches: 400 batches / 2 = 200 steps
    assert eff.max_steps == 200 and eff.val_check_steps == 100


def test_example_configs_load_for_their_task():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        explicit = vars(cli.build_parser().parse_args(["--config", str(path)]))
        opts, task_kw, train_kw = cli.split_settings(cli.resolve_settings(explicit, []))
        TrainConfig(**train_kw)
        assert opts.task in TASK_BUILDERS


def test_unknown_keys_in_trainer_config_name_the_nearest():
    with pytest.raises(ConfigError, match="did you mean min_lr_ratio"):
        TrainConfig.from_dict({"min_lr_ratoi": 0.1})


def test_min_lr_ratio_flag_exists_and_reaches_the_schedule(tmp_path, era5_cache):
    assert (
        cli.main(
            [
                "--min_lr_ratio",
                "0.5",
                "--max_steps",
                "3",
                "--warmup_steps",
                "0",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "m",
                *SMALL,
            ]
        )
        == 0
    )
    eff = json.loads((tmp_path / "m" / "config.json").read_text())["effective"]
    assert eff["min_lr_ratio"] == 0.5


@pytest.mark.slow
def test_rerun_from_the_written_config_is_bit_identical(tmp_path, era5_cache):
    """Every run writes config.toml; --config with it re-runs the same job, bit for bit on a CPU."""
    assert (
        cli.main(["--max_steps", "4", "--seq_len", "3", "--output_dir", str(tmp_path), "--run_name", "a", *SMALL]) == 0
    )
    assert cli.main(["--config", str(tmp_path / "a" / "config.toml")]) == 0
    again = tmp_path / "a-2"  # the same name again: a new suffixed directory, the first run untouched
    a = torch.load(tmp_path / "a" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(again / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    cfg = json.loads((again / "config.json").read_text())["requested"]
    assert cfg["max_steps"] == 4


def test_a_flag_replaces_the_files_setting_of_the_same_thing_in_other_units(tmp_path: Path) -> None:
    """`--config configs/seed002_mmseg.toml --max_steps 4` failed: "TrainConfig: give max_steps (optimizer steps)
    or max_batches (batches), not both" (runner.max_iters -> max_batches came from the file). Flags win over the
    file, also across the two units of one setting; the file's own contradiction is still an error."""
    root = Path(__file__).resolve().parents[1]
    explicit = cli.build_parser().parse_args(["--config", str(root / "configs" / "seed002_mmseg.toml"),
                                              "--max_steps", "4", "--val_check_steps", "2"])  # fmt: skip
    notes: list[str] = []
    _, _, train_kw = cli.split_settings(cli.resolve_settings(vars(explicit), notes))
    assert train_kw["max_steps"] == 4 and "max_batches" not in train_kw
    assert train_kw["val_check_steps"] == 2 and "val_check_batches" not in train_kw
    TrainConfig(**train_kw)  # no "not both" error
    assert any(n.startswith("max_steps=4 from the command line replaces max_batches=400 from --config") for n in notes)
    both = tmp_path / "both.toml"
    both.write_text("max_steps = 4\nmax_batches = 8\n")
    _, _, kw = cli.split_settings(
        cli.resolve_settings(vars(cli.build_parser().parse_args(["--config", str(both)])), [])
    )
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(**kw)


def test_short_help_lists_common_flags_and_groups(capsys):
    """--help is one screen of common flags and the group names; --help GROUP shows that group only."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    short = capsys.readouterr().out
    assert "--batch_size" in short and "--lr " in short and "--help-all" in short
    assert "--lim_max_modes" not in short and "--help GROUP" in short
    assert len(short.splitlines()) < 80
    with pytest.raises(SystemExit):
        cli.main(["--help", "optimizer"])
    group = capsys.readouterr().out
    assert "--min_lr_ratio" in group and "--batch_size" not in group
    with pytest.raises(SystemExit) as e:
        cli.main(["--help", "nosuchgroup"])
    assert e.value.code == 2 and "no such group" in capsys.readouterr().err


def test_no_project_lore_in_help_or_messages(capsys):
    """Users never read our design notes: no "seed 00x" in any flag help, and every frequency says its unit."""
    with pytest.raises(SystemExit):
        cli.main(["--help-all"])
    out = " ".join(capsys.readouterr().out.split())
    assert not re.search(r"seed 00\d", out, re.I), re.findall(r".{40}seed 00\d.{20}", out)
    units = ("optimizer steps", "batches", "epochs", "validations", "seconds")
    for f in dataclasses.fields(TrainConfig):
        if f.name.endswith(("_every", "_interval", "_steps", "_batches", "patience")) and f.name != "warmup_steps":
            assert any(u in f.metadata["help"] for u in units), f"{f.name}: the help does not say its unit"


def test_preset_seed_is_an_alias_of_full(tmp_path, capsys):
    kw, note = cli.resolve_task_args("era5", {}, "seed", on_gpu=False)
    assert "preset: full" in note and kw["d_model"] == 512
    opts, _, _ = cli.split_settings({"preset": "seed"})
    assert opts.preset == "full"


# ------------------------------------------------------------------------------------------- one validator
def test_a_new_field_gets_flag_check_and_message_from_its_knob():
    """The metadata scheme other helpers' fields use: a knob's rule is enforced by every door with one message."""
    import argparse

    from trainer.cli.options import add_dataclass_arguments
    from trainer.config import check_settings, field_rules, knob

    @dataclasses.dataclass
    class Extra:
        ema_decay: float = knob(0.999, "EMA decay per optimizer step", "ema", gt=0, max=1)
        ema_every: int = knob(1, "optimizer steps between EMA updates", "ema", min=1)

    p = argparse.ArgumentParser(exit_on_error=False)
    add_dataclass_arguments(p, Extra)
    assert p.parse_args(["--ema_decay", "0.5"]).ema_decay == 0.5
    with pytest.raises(argparse.ArgumentError, match="nan: not finite; use a finite number > 0 and <= 1"):
        p.parse_args(["--ema_decay", "nan"])
    with pytest.raises(ConfigError, match=r"^f.toml: ema_every=0: out of range; use a whole number >= 1$"):
        check_settings({"ema_every": 0}, field_rules(Extra), "f.toml")
    with pytest.raises(ConfigError, match="'ema_dekay' \\(did you mean ema_decay"):
        check_settings({"ema_dekay": 0.9}, field_rules(Extra), "f.toml")
    with pytest.raises(TypeError, match="unknown rule keyword"):
        knob(1, "x", "g", minimum=1)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("lr", float("nan"), "lr=nan: not finite; use a finite number > 0"),
        ("weight_decay", -5, "weight_decay=-5.0: out of range; use a finite number >= 0"),
        ("min_lr_ratio", -3, "min_lr_ratio=-3.0: out of range; use a finite number in [0, 1]"),
        ("warmup_steps", -5, "warmup_steps=-5: out of range; use a whole number >= 0"),
        ("epochs", 10**30, "epochs=1000000000000000000000000000000: too large; use a whole number in [1, "),
        ("epochs", "2", None),
        ("save_best", "false", None),
        ("save_best", "maybe", "save_best='maybe': not understood; use on or off (true or false)"),
        ("run_name", "../../x", "run_name='../../x': holds a path separator"),
        ("run_name", ".", "run_name='.': not a name"),
        ("run_name", "a\udcff", "not valid UTF-8"),
        ("device", "bogus", "device='bogus': not a device"),
        ("batch_size", True, "batch_size=True: not a whole number"),
        ("gradient_clip_val", float("inf"), "gradient_clip_val=inf: not finite"),
        ("adam_betas", ["a", 0.9], "adam_betas=a 0.9: a is not a finite number; use 2 values"),  # names the element
    ],
)
def test_trainer_params_dicts_are_checked_like_flags(key, value, message):
    """BaseTrainer's door (TrainConfig.from_dict, which base.py calls): 'false' was taken as true, '2' ended in a
    TypeError, NaN weight decay trained an epoch of NaN weights."""
    if message is None:
        cfg = TrainConfig.from_dict({key: value}, where="trainer_params")
        assert getattr(cfg, key) == {"2": 2, "false": False}[value]
        return
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({key: value}, where="trainer_params")
    assert str(e.value).startswith(f"trainer_params: {key}=") and message in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[train]\nlr = 'x'\n\xff\xfe", "not UTF-8 text"),
        (b"[train]\nepochs = 9223372036854775807\n", "epochs=9223372036854775807: too large"),
        (b"[train]\nresume = 'runs/x'\n", "'resume' cannot be set in a config file; give --resume"),
        (b"config = 'other.toml'\n", "'config' cannot be set in a config file"),
        (b"[train]\nlrr = 0.1\n", "'lrr' (did you mean lr?)"),
        (b"[data]\nsamples_per_gpu = 'many'\n", "data.samples_per_gpu = 'many': not a int"),
    ],
)
def test_config_files_are_checked_by_the_same_rules(tmp_path, capsys, content, message):
    f = tmp_path / "c.toml"
    f.write_bytes(content)
    assert cli.main(["--config", str(f), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert not (tmp_path / "out").exists()


def test_config_path_that_is_not_a_file_says_what_it_is(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo.toml")
    for path, what in ((tmp_path, "is a directory"), (tmp_path / "fifo.toml", "is not a regular file")):
        assert cli.main(["--config", str(path)]) == 2
        assert what in capsys.readouterr().err


def test_config_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """config.toml was truncated, then written: a bad value or a kill in between left it empty, and the next
    resume then ran with defaults. Now a temp file is renamed over it, and text that cannot be written fails
    before the old file is touched."""
    from trainer import runfiles as options

    path = tmp_path / "config.toml"
    options.write_config_file(path, {"train": {"lr": 0.5}})
    before = path.read_bytes()
    with pytest.raises(UnicodeEncodeError):
        options.write_config_file(path, {"train": {"run_name": "a\udcff"}})
    assert path.read_bytes() == before

    def killed(*_a):
        raise KeyboardInterrupt  # a stop between the write and the rename

    monkeypatch.setattr(os, "replace", killed)  # the shared atomic writer (trainer.checkpoint.atomic_write)
    with pytest.raises(KeyboardInterrupt):
        options.write_config_file(path, {"train": {"lr": 0.25}})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_a_misspelt_keyword_of_trainconfig_gets_the_nearest_names():
    """TrainConfig(batchsize=3) was Python's bare TypeError; the flags, config files and BaseTrainer suggested."""
    with pytest.raises(TypeError, match=r"'batchsize' \(did you mean batch_size"):
        TrainConfig(batchsize=3)
    assert TrainConfig(batch_size=3).batch_size == 3

"""Every recipe of the seed guides 000-004, run as written (imports aside, sizes shrunk to seconds on a CPU),
each checked against what its seed promises. And the manual's seed-guide table (docs/guides/from-seed-guides.md).

A recipe is a code block a seed's reader would run. Shrinking replaces numbers only (epochs, d_model,
resolution, batch counts); the knobs under test keep the seed's values.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import train_optimized as cli
import trainer.compat.base_trainer as base_mod
from tests.helpers import metric_rows
from trainer import TrainConfig, Trainer
from trainer.compat.base_trainer import BaseTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
TINY_RAT = [('"d_model": 512', '"d_model": 32'), ('"dim_feedforward": 1024', '"dim_feedforward": 64'),
            ("resolution = 2\n", "resolution = 10\n")]  # fmt: skip
TINY_CLI = ["--resolution", "10", "--d_model", "16", "--num_heads", "2", "--dim_feedforward", "32", "--num_layers",
            "1", "--no-progress_bar", "--no-plots"]  # fmt: skip


def run_example(name: str, replacements: list[tuple[str, str]], train: bool = True) -> dict:
    """Execute docs/examples/<name> with number-only replacements (each must match); returns its globals."""
    path = EXAMPLES / name
    src = path.read_text(encoding="utf-8")
    for old, new in replacements:
        assert old in src, f"{name}: {old!r} not found; the recipe changed"
        src = src.replace(old, new)
    if not train:
        src = src.replace("model = trainer.train()", "")
    g: dict = {"__file__": str(path), "__name__": "recipe"}
    exec(compile(src, str(path), "exec"), g)
    return g


@pytest.fixture
def quickstart(in_tmp) -> dict:
    """Seed 000 §1's settings (shrunk), as the "... 其他参数 ..." of the other seed 000 recipes."""
    g = run_example("seed000_quickstart.py", TINY_RAT, train=False)
    tr = g["trainer"]
    return dict(
        title=tr.title,
        area=tr.area,
        uid=tr.uid,
        model_class=tr.model_class,
        dataset_class=tr.dataset_class,
        save_path=tr.save_path,
        pre_model=False,
        dataset_params=g["dataset_params"],
        model_params=g["model_params"],
    )


def logged(lines: list[str]) -> str:
    return "\n".join(lines)


# ============================================================================ seed 000: the BaseTrainer guide
def test_seed000_1_quick_start(in_tmp):
    """§1: the quick start as written trains, returns the model and saves it; the optimisations are on by default."""
    g = run_example("seed000_quickstart.py", [*TINY_RAT, ('"epochs": 500', '"epochs": 2')])
    tr: BaseTrainer = g["trainer"]
    cfg = tr.trainer.cfg
    # "默认优化（自动启用）": workers, pinning, mixed precision, persistent workers, prefetch 2 without asking
    assert (cfg.num_workers, cfg.pin_memory, cfg.persistent_workers, cfg.prefetch_factor) == (
        None,
        True,
        True,
        2,
    )
    assert cfg.precision == "auto" and tr.trainer.rt.precision == "32"  # bf16/fp16 on a GPU; fp32 on this CPU
    assert tr.trainer.data.on_device  # better than workers: the normalised data is held in memory
    # every sample each epoch, the last short batch kept, as the Lightning-based BaseTrainer's loaders
    assert cfg.batch_size == 150 and tr.summary["steps"] == 2 * -(-len(tr.trainer.task.train_set) // 150)
    state = torch.load(Path(base_mod.MODEL_SAVE_PATH) / "seq_len-2" / "ra_transformer.pkl", weights_only=True)
    # the returned model's weights and its constructor arguments (trainer.compat.base_trainer.load_model rebuilds it in one call)
    assert set(state["state_dict"]) == set(g["model"].state_dict()) and state["model_params"]["d_model"] > 0


def test_seed000_2_custom_optimisation_params(quickstart):
    """§2: every knob the seed sets by hand is honoured, or overridden with one line naming it and why."""
    trainer_params = {
        "epochs": 500,
        "batch_size": 150,

        # 数据加载优化（自定义）
        "num_workers": 6,           # 默认8，可根据CPU调整
        "pin_memory": True,         # 默认True
        "persistent_workers": True, # 默认True
        "prefetch_factor": 4,       # 默认2，增加预取提升速度

        # 训练精度优化
        "precision": "16-mixed",    # 默认"16-mixed"，可选"32"或"bf16-mixed"

        # 梯度累积（可选，默认1）
        "accumulate_grad_batches": 2,  # 累积2个batch，有效batch_size=300

        # 梯度裁剪（可选）
        "gradient_clip_val": 1.0,
        "gradient_clip_algorithm": "norm",
    }  # fmt: skip
    trainer_params.update(epochs=1, batch_size=50, progress_bar=False)  # shrunk: 5 batches, not 1 of 150
    lines: list[str] = []
    tr = BaseTrainer(**quickstart, trainer_params=trainer_params, log=lines.append)
    tr.train()
    t, out = tr.trainer, logged(lines)
    assert t.global_batch == 2 * 50  # 有效batch_size = batch_size x 2
    assert tr.summary["steps"] == math.ceil(t.batches_per_epoch / 2)  # one optimizer step per 2 batches
    assert (t.opt.clip_val, t.opt.clip_algorithm) == (1.0, "norm")
    # on this CPU: fp16 needs CUDA, the data is in memory; each override is one line with its reason
    assert "precision: 16-mixed needs a CUDA GPU" in out
    assert "num_workers=6, prefetch_factor and persistent_workers are not used" in out
    assert "pin_memory=True not used: the data is held in memory" in out


def test_seed000_3_torch_compile(quickstart, monkeypatch):
    """§3: compile_model with compile_mode compiles the model in that mode (torch.compile recorded, not run)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    trainer_params = {
        "epochs": 500,
        "batch_size": 150,

        # PyTorch 2.0 编译（需要PyTorch >= 2.0）
        "compile_model": True,
        "compile_mode": "reduce-overhead",  # 可选: "default", "reduce-overhead", "max-autotune"
    }  # fmt: skip
    trainer_params.update(epochs=1, progress_bar=False)
    lines: list[str] = []
    BaseTrainer(**quickstart, trainer_params=trainer_params, log=lines.append).train()
    assert calls == [{"mode": "reduce-overhead"}]
    assert "compile: torch.compile(mode='reduce-overhead'); the first steps include compiling" in logged(lines)


def test_seed000_4_debug_mode_is_the_before_loop(quickstart):
    """§4 禁用优化: the seed's four settings switch every optimisation off, data path included, and say so."""
    trainer_params = {
        "epochs": 500,
        "batch_size": 50,           # 恢复原始batch size

        # 禁用优化
        "num_workers": 0,           # 单线程数据加载
        "pin_memory": False,        # 禁用内存固定
        "persistent_workers": False,
        "precision": "32",          # FP32全精度
    }  # fmt: skip
    trainer_params.update(epochs=1, progress_bar=False)
    lines: list[str] = []
    tr = BaseTrainer(**quickstart, trainer_params=trainer_params, log=lines.append)
    tr.train()
    cfg, t = tr.trainer.cfg, tr.trainer
    assert tr.config.baseline and "switch the optimisations off (num_workers 0" in logged(lines)
    assert (cfg.precision, cfg.num_workers, cfg.pin_memory, cfg.persistent_workers) == ("32", 0, False, False)
    assert not t.data.on_device and cfg.validation_interval == 1  # read through the loader; validated every epoch
    rows = metric_rows(Path(tr.summary["run_dir"]))
    assert sum(r["kind"] == "train" for r in rows) == tr.summary["steps"]  # the loss read every step


def test_seed000_5_batch_size_and_learning_rate_table(capsys):
    """§5: new_lr = old_lr x sqrt(new/old); plainloop's lr_scaling "sqrt" gives the seed's example and table."""
    import math  # noqa: F811  (the seed's snippet imports it)

    old_lr = 1e-3
    old_batch = 50
    new_batch = 150

    new_lr = old_lr * math.sqrt(new_batch / old_batch)
    print(f"New learning rate: {new_lr:.4e}")  # 输出: 1.7321e-03
    assert capsys.readouterr().out.strip() == "New learning rate: 1.7321e-03"

    from trainer.optim import scaled_lr

    assert scaled_lr(old_lr, new_batch, old_batch, "sqrt") == pytest.approx(new_lr)
    # the table's learning-rate column (batch range -> lr range) from 1e-3 at batch 50, to its 2 digits
    table = {(100, 150): (1.4e-3, 1.7e-3), (200, 250): (2.0e-3, 2.2e-3), (300, 400): (2.4e-3, 2.8e-3),
             (500, 600): (3.2e-3, 3.5e-3)}  # fmt: skip
    for batches, lrs in table.items():
        for bs, lr in zip(batches, lrs):
            assert scaled_lr(1e-3, bs, 50, "sqrt") == pytest.approx(lr, abs=0.051e-3)


def test_seed000_6_comparison_has_two_runs_and_a_real_before(in_tmp, capsys):
    """§6: the comparison prints a speed-up; the two trainers (one uid) get their own run directories; the
    "before" is plainloop's baseline loop, the "after" its defaults."""
    g = run_example("seed000_comparison.py", [*TINY_RAT, ('"epochs": 5', '"epochs": 1')])
    out = capsys.readouterr().out
    m = re.search(r"速度提升: ([0-9.]+)x", out)
    assert m and float(m.group(1)) == pytest.approx(g["unopt_time"] / g["opt_time"], abs=0.006)
    before, after = g["unopt_trainer"], g["opt_trainer"]
    d_before, d_after = Path(before.summary["run_dir"]), Path(after.summary["run_dir"])
    assert d_after.name == d_before.name + "-2"  # same uid, separate directories
    cfg_b = json.loads((d_before / "config.json").read_text())
    cfg_a = json.loads((d_after / "config.json").read_text())
    assert cfg_b["requested"]["baseline"] and not cfg_a["requested"]["baseline"]
    assert cfg_b["effective"]["device_cache"] is False and cfg_b["effective"]["log_every"] == 1
    assert any("held on cpu" in n for n in cfg_a["runtime"]["notes"])  # after: data in memory
    assert not any("held on cpu" in n for n in cfg_b["runtime"]["notes"])
    assert cfg_b["effective"]["batch_size"] == 50 and cfg_a["effective"]["batch_size"] == 150
    for d in (d_before, d_after):  # every file of each run is its own
        s = json.loads((d / "summary.json").read_text())
        assert s["run_dir"] == str(d) and (d / "checkpoints" / "last.pt").is_file()


def test_seed000_7_performance_callback(quickstart, capsys):
    """§7 方法2: the seed's per-epoch throughput callback, on plainloop's hooks (BaseTrainer(callbacks=[...]))."""

    class PerformanceCallback:  # the seed's Lightning callback, on the same epoch hooks
        def __init__(self):
            self.epoch_start_time = None
            self.epochs = []

        def on_train_epoch_start(self, trainer, epoch):
            self.epoch_start_time = time.time()

        def on_train_epoch_end(self, trainer, epoch):
            epoch_time = time.time() - self.epoch_start_time
            samples_per_epoch = trainer.batches_per_epoch * trainer.cfg.batch_size
            throughput = samples_per_epoch / epoch_time
            print(f"\n📊 Epoch {trainer.epoch} Performance:")
            print(f"  • Time: {epoch_time:.2f}s")
            print(f"  • Throughput: {throughput:.2f} samples/s")
            print(f"  • Samples: {samples_per_epoch}")
            self.epochs.append(throughput)

    cb = PerformanceCallback()
    tr = BaseTrainer(
        **quickstart, trainer_params={"epochs": 2, "batch_size": 64, "progress_bar": False}, callbacks=[cb]
    )
    tr.train()
    out = capsys.readouterr().out
    assert len(cb.epochs) == 2 and all(v > 0 for v in cb.epochs)
    assert out.count("📊 Epoch") == 2 and "Throughput:" in out


def test_seed000_8_troubleshooting(quickstart):
    """§8: the out-of-memory, worker, NaN and hanging-loader remedies, each taken as the seed writes it."""

    def cfg(**tp):
        return BaseTrainer(**quickstart, trainer_params={**tp, "progress_bar": False}).config

    assert cfg(batch_size=100).batch_size == 100  # 方法1: 减小batch size
    # 方法2: 梯度累积保持有效batch size: 75 x 2 = 150
    tr = BaseTrainer(**quickstart, trainer_params={"batch_size": 75, "accumulate_grad_batches": 2})
    assert Trainer(tr.config, tr.build_task(), log=lambda _s: None).global_batch == 150
    assert cfg(num_workers=4).num_workers == 4  # 问题2: num_workers 8 -> 4
    assert cfg(precision="bf16-mixed").precision == "bf16-mixed"  # 问题3 方法1
    assert cfg(precision="32").precision == "32"  # 问题3 方法2
    assert cfg(gradient_clip_val=0.5).gradient_clip_val == 0.5  # 问题3 方法3
    c = cfg(num_workers=0, persistent_workers=False)  # 问题4: Windows, loader hangs
    assert (c.num_workers, c.persistent_workers, c.baseline) == (
        0,
        False,
        False,
    )  # not the whole "before" loop


def test_seed000_8_gradient_checkpointing(quickstart):
    """§8 方法3: model_params={"use_gradient_checkpointing": True} (the RecursiveAttentionTransformer's knob)."""
    import inspect

    from models.ratransformer import RecursiveAttentionTransformer

    if "use_gradient_checkpointing" not in inspect.signature(RecursiveAttentionTransformer).parameters:
        pytest.skip("RecursiveAttentionTransformer has no use_gradient_checkpointing yet (issue 11, point 7)")
    model_params = {**quickstart.pop("model_params"), "use_gradient_checkpointing": True}
    tr = BaseTrainer(**quickstart, model_params=model_params, trainer_params={"epochs": 1, "progress_bar": False})
    tr.train()
    assert tr.trainer.raw_model.use_gradient_checkpointing and tr.summary["steps"] >= 1


def test_seed000_9_recommended_configuration(quickstart):
    """§9 推荐配置 (RTX 4060 Ti 8GB): taken as written; the lr of 1.7e-3 reaches the optimizer; on this CPU each
    setting that cannot apply is named once."""
    trainer_params = {
        "epochs": 500,
        "batch_size": 150,

        # 数据加载
        "num_workers": 6,           # 保守配置，避免内存问题
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": 2,

        # 训练精度
        "precision": "16-mixed",    # 混合精度

        # 梯度管理
        "gradient_clip_val": 1.0,
    }  # fmt: skip
    model_params = {
        **quickstart.pop("model_params"),
        "learning_rate": 1.7e-3,
    }  # 从1e-3调整（batch size从50→150）
    lines: list[str] = []
    tr = BaseTrainer(**quickstart, trainer_params=trainer_params, model_params=model_params, log=lines.append)
    t = Trainer(tr.config, tr.build_task(), log=lines.append)
    assert t.optim.schedule.base_lrs == [pytest.approx(1.7e-3)] * len(t.optimizer.param_groups)  # before warm-up
    notes = "\n".join(t.notes)
    assert "precision: 16-mixed needs a CUDA GPU" in notes and "num_workers=6" in notes


# ============================================================================ seed 001: the training-speed guide
def test_seed001_training_monitor_snippet(tmp_path):
    """The TrainingMonitor snippet as written: per-iteration times in, a summary with the step-time figures out."""
    from utils.performance_monitor import TrainingMonitor

    def train_step():  # "... 训练代码 ..."
        x = torch.randn(64, 64)
        (x @ x).sum()
        time.sleep(0.005)

    # 在训练开始前
    monitor = TrainingMonitor()
    monitor.start_monitoring()

    for _ in range(12):
        # 在训练循环中记录迭代时间
        start_time = time.time()
        train_step()
        iteration_time = time.time() - start_time
        monitor.log_iteration(iteration_time)

    # 训练结束后
    monitor.stop_monitoring()
    summary = monitor.get_summary()
    print(summary)
    assert summary["iterations"] == 12 and summary["iter_time_s"]["p50"] >= 0.005
    assert summary["iters_per_s"] > 0 and summary["cpu_count_logical"] >= 1
    json.dumps(summary)  # serialisable, as the seed prints and stores it

    # the same monitor handed to plainloop's loop is fed every iteration, and its summary is in summary.json
    tr = BaseTrainer(
        "mon",
        None,
        "u",
        Head,
        PKRows,
        tmp_path / "m.pt",
        monitor=TrainingMonitor(),
        trainer_params={
            "epochs": 1,
            "batch_size": 32,
            "num_workers": 0,
            "progress_bar": False,
            "output_dir": str(tmp_path),
        },
    )
    tr.train()
    assert tr.summary["monitor"]["iterations"] == tr.summary["steps"] == -(-len(tr.trainer.task.train_set) // 32) > 0


def test_seed001_command_line(tmp_path, era5_cache, monkeypatch, capsys):
    """`python train_tom500_optimized.py --batch_size 8 --num_workers 16 --compile_model --validation_interval
    20` is `python train_optimized.py` with the same flags: batch 8, compile, validation every 20 epochs (AMP,
    prefetch 2, persistent workers, non_blocking copies, TF32 and cudnn.benchmark are defaults)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    argv = ["--batch_size", "8", "--num_workers", "16", "--compile_model", "--validation_interval", "20"]
    shrink = [
        "--epochs",
        "21",
        "--split_ratio",
        "0.2",
        "0.1",
        "0.1",
        "--output_dir",
        str(tmp_path),
        "--run_name",
        "s1",
    ]
    assert cli.main(argv + shrink + TINY_CLI) == 0
    run = tmp_path / "s1"
    eff = json.loads((run / "config.json").read_text())["effective"]
    assert (eff["batch_size"], eff["compile_model"], eff["validation_interval"]) == (8, True, 20)
    assert (eff["prefetch_factor"], eff["persistent_workers"], eff["tf32"], eff["cudnn_benchmark"]) == (
        2,
        True,
        True,
        True,
    )
    assert calls == [{"mode": "default"}]
    val_epochs = [r["epoch"] for r in metric_rows(run) if r["kind"] == "val"]
    assert val_epochs == [20, 21]  # every 20 epochs, and the last one
    assert "num_workers=16, prefetch_factor and persistent_workers are not used" in capsys.readouterr().out


# ============================================================================ seed 002: batch size vs speed (mmseg)
@pytest.mark.slow
def test_seed002_mmseg_config_knobs(tmp_path, era5_cache, capsys):
    """configs/seed002_mmseg.toml as written: samples_per_gpu, workers_per_gpu, IterBasedRunner max_iters (batches),
    evaluation.interval (batches), cumulative_iters and fp16 loss_scale are each understood, with one note each."""
    assert (
        cli.main(
            [
                "--config",
                str(ROOT / "configs" / "seed002_mmseg.toml"),
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "s2",
                *TINY_CLI,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for knob in (
        "samples_per_gpu=16",
        "workers_per_gpu=1",
        "max_iters=400",
        "interval=200",
        "cumulative_iters=2",
        "loss_scale=512.0",
    ):
        assert knob in out, knob
    run = tmp_path / "s2"
    eff = json.loads((run / "config.json").read_text())["effective"]
    assert (eff["batch_size"], eff["accumulate_grad_batches"], eff["loss_scale"]) == (16, 2, "512.0")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 400 // 2  # 400 mmseg iterations = 400 batches = 200 optimizer steps with accumulation 2
    val_steps = [r["step"] for r in metric_rows(run) if r["kind"] == "val"]
    assert val_steps == [100, 200]  # every 200 batches, and the last step validated once, not twice


def test_seed002_config_examples_as_written(tmp_path):
    """策略2/5/6's dicts (data, evaluation, runner) as a config file, key for key."""
    from trainer.cli.options import load_config_file

    path = tmp_path / "seed002.toml"
    path.write_text(
        """
[data]
samples_per_gpu = 6
workers_per_gpu = 12
pin_memory = true
persistent_workers = true
prefetch_factor = 4

[evaluation]
interval = 40000
metric = "mIoU"
efficient_test = true
pre_eval = true

[runner]
type = "IterBasedRunner"
max_iters = 200000
accumulative_counts = 2
""",
        encoding="utf-8",
    )
    flat = load_config_file(path, [])
    assert flat == {
        "batch_size": 6,
        "num_workers": 12,
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": 4,
        "val_check_batches": 40000,
        "max_batches": 200000,
        "accumulate_grad_batches": 2,
    }


# ============================================================================ seed 003: the system report
@pytest.mark.slow
def test_seed003_system_report(tmp_path, era5_cache, capsys):
    """`python train_optimized.py --system_report`: hardware, measured utilisation and bottleneck, and
    recommendations measured in the same run (the seed's were estimates)."""
    assert (
        cli.main(
            [
                "--system_report",
                "--report_steps",
                "3",
                "--report_repeats",
                "1",
                "--batch_size",
                "16",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "s3",
                *TINY_CLI,
            ]
        )
        == 0
    )
    text = (tmp_path / "s3" / "report.md").read_text(encoding="utf-8")
    for section in ("## Verdict", "## Before / after", "## Your configuration, measured", "## Hardware"):
        assert section in text, section
    assert re.search(r"\d+ (logical|cores|CPUs)", text) and "samples/s" in text
    assert not (tmp_path / "s3" / "trials").exists()  # trial runs are scratch


# ============================================================================ seed 004: the re-ID guide
@pytest.fixture(scope="module")
def reid_train():
    from datasets.reid import synthetic_reid

    train, _, _ = synthetic_reid(40, samples_per_id=8, image_size=(16, 8), seed=0)
    return train


def test_seed004_cached_sampler(reid_train, caplog):
    """① CachedModalAwarePKSampler as written: metadata cached once (the cache summary is logged), then every
    batch is P x K with an RGB sample per identity, without per-batch modality inference."""
    import logging

    from datasets.cached_sampler import CachedModalAwarePKSampler

    class config:  # the seed reads its seed from a config object
        sampler_seed = 7

    train_dataset, actual_batch_size, num_instances = reid_train, 32, 4
    calls = []
    train_dataset.infer_modalities_of_sample = lambda i: calls.append(i)  # the seed's slow path: must not run
    caplog.set_level(logging.INFO, logger="datasets.cached_sampler")
    train_sampler = CachedModalAwarePKSampler(
        dataset=train_dataset,
        batch_size=actual_batch_size,
        num_instances=num_instances,
        ensure_rgb=True,
        prefer_complete=True,
        seed=getattr(config, "sampler_seed", 42),
    )
    del train_dataset.infer_modalities_of_sample
    assert "ids: 40" in caplog.text and "pairable" in caplog.text and "batches per epoch" in caplog.text
    assert train_sampler.setup_seconds < 5  # the seed: "缓存时间: 应该 <5秒"
    pids, mods = np.asarray(reid_train.pids), np.asarray(reid_train.modalities)
    batches = list(train_sampler)
    assert len(batches) == len(train_sampler) > 0 and not calls
    for b in batches:
        assert len(b) == 32 and len(set(pids[b])) == 8  # P = 8 identities x K = 4
        for pid in set(pids[b]):
            assert "rgb" in set(mods[b][pids[b] == pid])  # ensure_rgb


def test_seed004_windows_dataloader(reid_train):
    """③ The seed's DataLoader as written raises in PyTorch (drop_last with a batch_sampler); the sampler's own
    drop_last does that job, and without the keyword the same loader yields P x K batches."""
    from torch.utils.data import DataLoader

    from datasets.cached_sampler import CachedModalAwarePKSampler

    train_dataset, train_sampler = reid_train, CachedModalAwarePKSampler(reid_train, 32, 4, drop_last=True)
    compatible_collate_fn = None  # the seed's own collate function; PyTorch's default here
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive with.*drop_last"):
        DataLoader(
            train_dataset,
            batch_sampler=train_sampler,
            num_workers=2,           # Windows: 2比4更快
            pin_memory=True,         # 配合non_blocking
            persistent_workers=True, # 避免重复spawn
            prefetch_factor=1,       # 降低内存争用
            drop_last=True,          # 避免动态shape
            collate_fn=compatible_collate_fn
        )  # fmt: skip
    loader = DataLoader(
        train_dataset,
        batch_sampler=train_sampler,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=True,
        prefetch_factor=1,
        collate_fn=compatible_collate_fn,
    )
    batch = next(iter(loader))
    assert batch["image"].shape[0] == 32 and train_sampler.drop_last


def test_seed004_non_blocking_transfer():
    """④ move_batch_to_device: every tensor of a nested batch is copied with non_blocking=True."""
    from collections import namedtuple

    from trainer.data import to_device

    seen = []

    class T(torch.Tensor):
        def to(self, *args, **kwargs):
            seen.append(kwargs.get("non_blocking"))
            return torch.Tensor.to(self.as_subclass(torch.Tensor), *args, **kwargs)

    t = lambda: torch.zeros(2).as_subclass(T)  # noqa: E731
    Pair = namedtuple("Pair", "a b")
    to_device({"x": t(), "y": [t(), (t(), Pair(t(), t()))]}, torch.device("cpu"))
    assert seen == [True] * 5


class PKRows(torch.utils.data.Dataset):
    """A re-ID-shaped dataset for the loop: 8-dim features, identity labels, RGB/IR modalities per sample."""

    def __init__(self, ids: int = 64, per_id: int = 8):
        g = torch.Generator().manual_seed(0)
        self.pids = np.repeat(np.arange(ids), per_id)
        self.modalities = np.array(["rgb", "ir"] * (ids * per_id // 2))
        self.x = torch.randn(ids * per_id, 8, generator=g)
        self.y = torch.as_tensor(self.pids % 3, dtype=torch.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def test_seed004_log_every_norm_every_progress(tmp_path, monkeypatch):
    """② LOG_EVERY = 100, NORM_EVERY = 200, progress bar every 10 batches (plainloop's defaults), and ⑤ the
    gradient norm only computed for clipping and read back every NORM_EVERY steps."""
    from datasets.cached_sampler import CachedModalAwarePKSampler
    from trainer import Task

    assert (TrainConfig.log_every, TrainConfig.norm_every, TrainConfig.progress_every) == (100, 200, 10)
    updates = []

    class Bar:  # records the progress bar's refreshes
        n = 0

        def __init__(self, total, initial, **kw):
            self.n = initial

        def update(self, k):
            updates.append(k)
            self.n += k

        def set_postfix(self, **kw):
            pass

        def write(self, s):
            pass

        def close(self):
            pass

    import trainer.console

    monkeypatch.setattr(trainer.console, "tqdm", Bar)  # the engine's progress bar
    data = PKRows()

    def sampler(ds, batch_size, seed, rank, world_size, drop_last):
        return CachedModalAwarePKSampler(
            ds, batch_size, 4, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last, num_passes=8
        )  # 8 passes x 64 ids / P = 2 = 256 batches

    task = Task(
        "pk",
        torch.nn.Linear(8, 1),
        data,
        batch_sampler_fn=sampler,
        loss_fn=lambda m, b: ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean(),
    )
    cfg = TrainConfig(
        batch_size=8, epochs=1, num_workers=0, gradient_clip_val=1.0, output_dir=str(tmp_path), run_name="pk"
    )
    summary = Trainer(cfg, task, log=lambda _s: None).fit()
    assert summary["steps"] == 256
    rows = metric_rows(tmp_path / "pk")
    assert [r["step"] for r in rows if r["kind"] == "train"] == [100, 200, 256]  # one loss read per 100 steps
    assert [r["step"] for r in rows if "grad_norm" in r] == [200]  # the clipped norm, read at NORM_EVERY
    assert len(updates) == 26 and sum(updates) == 256  # every 10 batches, and at the epoch end


# ============================================================================ docs: "Coming from the seed guides"
SEED_KNOBS = {
    "000": [
        "epochs",
        "batch_size",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "precision",
        "accumulate_grad_batches",
        "gradient_clip_val",
        "gradient_clip_algorithm",
        "compile_model",
        "compile_mode",
        "learning_rate",
        "new_lr = old_lr × sqrt(new_batch_size / old_batch_size)",
        "use_gradient_checkpointing",
        "callbacks",
        "comparison test",
        "checkpointing",
        "warmup",
        "MODEL_SAVE_PATH",
        "pre_model",
    ],
    "001": [
        "autocast / GradScaler",
        "prefetch_factor",
        "persistent_workers",
        "non_blocking",
        "torch.compile",
        "--batch_size",
        "--num_workers",
        "--compile_model",
        "--validation_interval",
        "allow_tf32",
        "cudnn.benchmark",
        "PYTORCH_CUDA_ALLOC_CONF",
        "optimize_training.sh",
        "TrainingMonitor",
        'mode="reduce-overhead"',
        "data caching",
    ],
    "002": [
        "samples_per_gpu",
        "workers_per_gpu",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "fp16 loss_scale",
        "evaluation.interval",
        "IterBasedRunner max_iters",
        "accumulative_counts",
        "iter/s vs samples/s",
        "torch.utils.bottleneck",
        "nvidia-smi dmon",
        "lr linear scaling",
    ],
    "003": [
        "hardware and utilisation",
        "bottleneck",
        "recommendations with expected gain",
        "priority list",
        "cost-benefit (hours, kWh)",
        "Flash Attention",
        "data cache (HDF5 / memmap)",
        "DDP",
    ],
    "004": [
        "CachedModalAwarePKSampler",
        "LOG_EVERY",
        "NORM_EVERY",
        "progress bar every 10 batches",
        "num_workers=2 (Windows)",
        "prefetch_factor=1",
        "drop_last",
        "non_blocking + pin_memory",
        "gradient norm on demand",
        "feature-norm monitoring",
        "batches per epoch",
        "gradient_accumulation_steps",
        "torch.compile",
    ],
}


SEED_PAGE = ROOT / "docs" / "guides" / "from-seed-guides.md"


def readme_table() -> list[tuple[str, str, str]]:
    """The mapping table of the manual's "Coming from the seed guides" page."""
    text = SEED_PAGE.read_text(encoding="utf-8")
    m = re.search(r"\n## The mapping table\n(.*?)(?=\n## |\Z)", text, re.S)
    assert m, f"{SEED_PAGE.relative_to(ROOT)} has no '## The mapping table' section"
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3 and cells[0] not in ("seed", "") and not set(cells[0]) <= set("-: "):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_readme_seed_table_names_every_knob_of_every_seed():
    rows = readme_table()
    for seed, knobs in SEED_KNOBS.items():
        named = " ".join(knob for s, knob, _ in rows if s == seed)
        missing = [k for k in knobs if k not in named]
        assert not missing, f"seed {seed}: the seed-guide table in docs/ does not name {missing}"


def _importable(name: str) -> bool:
    """`a.b.c` is a module, or an attribute path inside the longest importable module prefix."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return True
    return False


def test_readme_seed_table_points_at_real_flags_keys_and_apis():
    """Each `code` in the table's plainloop column is a real train_optimized.py flag, TrainConfig field or
    BaseTrainer argument/key, mmseg config key, launcher variable, file of the repository, or importable name."""
    import inspect

    from trainer.cli.options import _MMSEG

    flags = {o for a in cli.build_parser()._actions for o in a.option_strings}
    keys = (
        set(TrainConfig.__dataclass_fields__) | set(base_mod._OWN_KEYS) | set(inspect.signature(BaseTrainer).parameters)
    )
    launcher = (ROOT / "optimize_training.sh").read_text(encoding="utf-8")
    mmseg = {f"{t}.{k}" for t, k in _MMSEG if t} | {"fp16.loss_scale"}
    checked = 0
    for seed, knob, where in readme_table():
        for code in re.findall(r"`([^`]+)`", where):
            checked += 1
            head = re.match(r"[-\w./:]+", code).group(0)
            what = f"seed {seed} {knob!r}: `{code}`"
            if head.startswith("--"):
                assert head in flags, f"{what} is not a train_optimized.py flag"
            elif re.fullmatch(r"[A-Z][A-Z0-9_]+", head):
                assert head in launcher, f"{what} is not a variable of optimize_training.sh"
            elif "/" in head or head.endswith((".py", ".sh", ".toml", ".md")):
                assert (ROOT / head).exists(), f"{what} is not a file of the repository"
            elif head in mmseg:
                continue
            elif "." in head:
                assert _importable(head), f"{what} cannot be imported"
            else:
                assert head in keys, f"{what} is not a TrainConfig field or a BaseTrainer argument or key"
    assert checked > 40

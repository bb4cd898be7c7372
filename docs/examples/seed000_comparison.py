"""The BaseTrainer guide's §6 (优化对比测试): its before/after comparison, with only the import lines changed and its
"... 参数配置 ..." placeholders filled with the quick start's settings (section 1 of the same guide).

Run from the repository root:  python docs/examples/seed000_comparison.py
(5 epochs of the guide's full configuration, twice: meant for a GPU.)

What plainloop does with it:
- "before": trainer_params that switch the optimisations off as the guide does (num_workers 0, precision "32",
  pin_memory False) run plainloop's baseline loop (`baseline=True`): also no in-memory data, `.item()` every
  step, validation every epoch. One line at the start says so; add "baseline": False to opt out.
- both trainers share one uid, as the guide writes it; each still gets its own run directory
  (runs/RATransformer-<uid> and runs/RATransformer-<uid>-2): nothing is mixed or overwritten there. They do
  share `save_path`, so the second run's weights replace the first's, and the second run says so.
"""

import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, when run as a script

from datasets.area import Area  # noqa: E402
from datasets.era5 import ERA5SSTMonthlyDataset  # noqa: E402
from models.ratransformer import RecursiveAttentionTransformer  # noqa: E402
from trainer.base import MODEL_SAVE_PATH  # noqa: E402

# ---- the quick start's settings: what the guide's "... 参数配置 ..." stands for ----
area = Area("Global", lon=[-180, 180], lat=[-80, 80], description="全球区域")
trainer_uid = str(uuid.uuid4())
resolution = 2
seq_len = 2
width = int(area.width / resolution)
height = int(area.height / resolution)
dataset_params = {"seq_len": seq_len, "offset": 0, "resolution": resolution}
model_params = {
    "width": width,
    "height": height,
    "seq_len": seq_len,
    "d_model": 512,
    "num_heads": 8,
    "num_layers": 3,
    "dim_feedforward": 1024,
    "dropout": 0.1,
    "recursion_depth": 2,
    "learning_rate": 1e-3,
}
common = dict(
    title="RATransformer",
    area=area,
    uid=trainer_uid,
    model_class=RecursiveAttentionTransformer,
    dataset_class=ERA5SSTMonthlyDataset,
    save_path=f"{MODEL_SAVE_PATH}/seq_len-{seq_len}/ra_transformer.pkl",
    pre_model=False,
    dataset_params=dataset_params,
    model_params=model_params,
)

# ---- from here on, the guide's code unchanged but for `**common` in place of "... 参数配置 ..." ----
import time  # noqa: E402

from trainer.base import BaseTrainer  # noqa: E402

# 测试未优化版本
print("=" * 60)
print("测试未优化训练（FP32 + 单线程）")
print("=" * 60)

unopt_trainer = BaseTrainer(
    **common,  # ... 参数配置 ...
    trainer_params={
        "epochs": 5,
        "batch_size": 50,
        "num_workers": 0,
        "precision": "32",
        "pin_memory": False,
    },
)

start_time = time.time()
unopt_trainer.train()
unopt_time = time.time() - start_time

print(f"未优化版本 5 epochs 用时: {unopt_time:.2f}秒")

# 测试优化版本
print("\n" + "=" * 60)
print("测试优化训练（FP16 + 多线程）")
print("=" * 60)

opt_trainer = BaseTrainer(
    **common,  # ... 相同参数配置 ...
    trainer_params={
        "epochs": 5,
        "batch_size": 150,
        # 使用默认优化配置
    },
)

start_time = time.time()
opt_trainer.train()
opt_time = time.time() - start_time

print(f"优化版本 5 epochs 用时: {opt_time:.2f}秒")

# 计算提速比
speedup = unopt_time / opt_time
print("\n" + "=" * 60)
print(f"🚀 速度提升: {speedup:.2f}x")
print("=" * 60)

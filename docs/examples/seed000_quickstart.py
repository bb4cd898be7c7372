"""The BaseTrainer guide's quick start (its section 1), with only the import lines changed for plainloop.

Run from the repository root:  python docs/examples/seed000_quickstart.py
(500 epochs of the guide's full configuration: meant for a GPU.)
"""

import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, when run as a script

import numpy as np  # noqa: F401,E402  (the guide imports it)

from datasets.area import Area  # noqa: E402
from datasets.era5 import ERA5SSTMonthlyDataset  # noqa: E402
from models.ratransformer import RecursiveAttentionTransformer  # noqa: E402
from trainer.base import MODEL_SAVE_PATH, BaseTrainer  # noqa: E402

# ---- from here on, the guide's code unchanged ----
# 配置区域
area = Area('Global', lon=[-180, 180], lat=[-80, 80], description='全球区域')

# 配置参数
trainer_uid = str(uuid.uuid4())
resolution = 2
seq_len = 2

width = int(area.width / resolution)
height = int(area.height / resolution)

# 数据集参数
dataset_params = {
    "seq_len": seq_len,
    "offset": 0,
    "resolution": resolution,
}

# 模型参数
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

# 训练参数 - 默认启用优化
trainer_params = {
    "epochs": 500,
    "batch_size": 150,  # ✅ 从50增加到150（显存充足）
}

# 创建训练器 - 优化功能已自动集成
trainer = BaseTrainer(
    title='RATransformer',
    area=area,
    uid=trainer_uid,
    model_class=RecursiveAttentionTransformer,
    dataset_class=ERA5SSTMonthlyDataset,
    save_path=f'{MODEL_SAVE_PATH}/seq_len-{seq_len}/ra_transformer.pkl',
    pre_model=False,
    dataset_params=dataset_params,
    trainer_params=trainer_params,
    model_params=model_params,
)

# 开始训练 - 自动享受 4-8倍速度提升
model = trainer.train()

"""The seed-style trainer where the guides import it: `from trainer.base import BaseTrainer` (also as
`src.trainer.base` when this folder is copied to src/trainer/, or `plainloop.base` installed). The code is in
compat/base_trainer.py."""

from .compat.base_trainer import MODEL_SAVE_PATH, BaseTrainer, load_model, load_weights_into

__all__ = ["MODEL_SAVE_PATH", "BaseTrainer", "load_model", "load_weights_into"]

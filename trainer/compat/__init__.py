"""Compatibility layers: a LightningModule or nanoGPT-style model, and the seed-style BaseTrainer, made into what
the core takes (a Task plus callbacks). They use only the core's public API."""

"""LightningModules: one thin adapter per model (loss, optimizer, metrics)."""

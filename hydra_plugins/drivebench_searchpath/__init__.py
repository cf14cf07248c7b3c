"""Hydra plugin package: puts drivebench's ``experiments/`` folder on the config search path."""

"""Hydra launcher ``hydra/launcher=drivebench_slurm``: each job of a multirun goes to SLURM with the
resources of its own machine profile (``drivebench/conf/machine/<name>.yaml``), so one sweep such as
``-m machine=h200,a100`` runs the same benchmark on two kinds of node. See docs/distributed.md.
"""

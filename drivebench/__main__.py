"""``python -m drivebench [overrides]``: compose the Hydra config and run the benchmark."""

import sys

import hydra
from omegaconf import DictConfig

from drivebench.cli import pop_local_rank, quote_storage_dirs
from drivebench.dist import external_rank_overrides
from drivebench.exit_watchdog import arm_exit_watchdog, exit_timeout_from_env


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from drivebench.app import main

    main(cfg)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *quote_storage_dirs(pop_local_rank(sys.argv[1:])), *external_rank_overrides()]
    try:
        _main()
    finally:  # also after a failed run: an exit that hangs is never better
        arm_exit_watchdog(exit_timeout_from_env())

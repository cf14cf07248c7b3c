"""Every launcher's way of passing the local rank is accepted and removed before Hydra parses."""

import pytest

from drivebench.cli import pop_local_rank


@pytest.mark.parametrize(
    "argv",
    [
        ["--local_rank=1", "model=qcnet"],
        ["--local-rank=1", "model=qcnet"],
        ["--local_rank", "1", "model=qcnet"],
        ["model=qcnet", "--local-rank", "1"],
    ],
)
def test_local_rank_forms(argv):
    env = {}
    assert pop_local_rank(argv, env) == ["model=qcnet"]
    assert env["LOCAL_RANK"] == "1"


def test_no_flag_leaves_environment_alone():
    env = {}
    assert pop_local_rank(["model=qcnet", "accel=max"], env) == ["model=qcnet", "accel=max"]
    assert "LOCAL_RANK" not in env


def test_flag_without_value_is_a_clear_error():
    with pytest.raises(SystemExit, match="needs a rank number"):
        pop_local_rank(["--local_rank"], {})

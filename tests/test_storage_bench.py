"""``bench=storage``: which checkpoint location is faster, with failing candidates reported as rows."""

from __future__ import annotations

import pytest

from drivebench.bench.storage import StorageBench, _split_dirs
from drivebench.errors import ConfigError
from test_ckpt_cli_helpers import run_cli, shared_cache, summary


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return shared_cache(tmp_path_factory)


def test_two_dirs_measured_fastest_named_unwritable_reported(tmp_path, cache):
    a, b = tmp_path / "a", tmp_path / "b"
    blocker = tmp_path / "regular-file"
    blocker.write_text("x")
    run_dir = tmp_path / "run"
    # no -m and no quotes: the CLI itself reads the comma list as candidates, not as a sweep
    proc = run_cli(["bench=storage", "model=qcnet", "model.size=test", "data.size=mini", "bench.repeats=2",
                    f"ckpt.dir={a},{b},{blocker}/ckpt", f"hydra.run.dir={run_dir}"], cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    storage = summary(run_dir)["storage"]
    rows = {row["dir"]: row for row in storage["dirs"]}
    assert list(rows) == [str(a), str(b), f"{blocker}/ckpt"]
    for d in (a, b):
        row = rows[str(d)]
        assert row["write_mb_per_s"]["n"] == 2 and row["write_mb_per_s"]["median"] > 0
        assert row["read_mb_per_s"]["median"] > 0 and row["filesystem"]["kind"]
        assert not [p for p in d.iterdir()], "probe files must be removed"
    faster = max((str(a), str(b)), key=lambda d: rows[d]["write_mb_per_s"]["median"])
    assert storage["fastest"] == faster
    assert "not writable" in rows[f"{blocker}/ckpt"]["error"]
    assert storage["bytes"] >= 2**20  # auto: weights + two Adam moments of the model
    assert f"fastest for checkpoints: {faster}" in proc.stdout


def test_remote_and_unknown_candidates(tmp_path):
    bench = StorageBench(repeats=2)
    size = 2**16
    memory = bench._measure("memory://storage-bench/x", size, {})
    assert memory["filesystem"]["kind"] == "fsspec:memory" and memory["write_mb_per_s"]["n"] == 2
    unknown = bench._measure("nosuchprotocol://bucket/x", size, {})
    assert "no filesystem for protocol 'nosuchprotocol'" in unknown["error"]
    hidden = bench._measure("nosuchprotocol://user:hunter22@host/x", size, {})
    assert "hunter22" not in str(hidden) and "***@host" in hidden["dir"]


def test_candidate_lists_and_bad_repeats():
    assert _split_dirs("/a, /b,") == ["/a", "/b"]
    assert _split_dirs(["/a", "s3://b/c"]) == ["/a", "s3://b/c"]
    assert _split_dirs(None) == []
    with pytest.raises(ConfigError, match="bench.repeats"):
        StorageBench(repeats=0)

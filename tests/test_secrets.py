"""Credentials never reach what a run writes: summary, logs, TensorBoard, saved Hydra configs."""

from __future__ import annotations

import logging

import pytest
import yaml

from drivebench.ckpt.store import CheckpointStore, CheckpointWriteError
from drivebench.errors import ConfigError
from drivebench.secrets import (REDACTED, RedactingFilter, install_log_redaction, redact, redact_argv, redact_override,
                                redact_text, redact_url, scrub_hydra_dir, secret_values)
from test_ckpt_cli_helpers import shared_cache, summary, train

SECRET, KEY = "TOPSECRET123", "AKIA999"


def test_redact_by_key_and_inside_storage_options():
    cfg = {"ckpt": {"dir": "s3://b/run", "storage_options": {"key": "AK", "client_kwargs": {"region_name": "eu"},
                                                              "anon": False, "endpoint_url": "https://x"}},
           "logger": {"api_key": "k1", "token": None}, "model": {"name": "qcnet", "keys": ["a"]}}
    out = redact(cfg)
    opts = out["ckpt"]["storage_options"]
    assert opts["key"] == REDACTED and opts["client_kwargs"]["region_name"] == REDACTED
    assert opts["anon"] == REDACTED and opts["endpoint_url"] == REDACTED  # everything under storage_options
    assert out["logger"] == {"api_key": REDACTED, "token": None}
    assert out["model"] == cfg["model"] and out["ckpt"]["dir"] == "s3://b/run"
    assert cfg["ckpt"]["storage_options"]["key"] == "AK"  # a copy: the input is untouched


@pytest.mark.parametrize("text, expected", [
    ("s3://AKIA:pw@host/bucket", "s3://***@host/bucket"),
    ("see https://user@example.com/x and gs://b/c", "see https://***@example.com/x and gs://b/c"),
    ("/plain/path", "/plain/path"),
])
def test_redact_url(text, expected):
    assert redact_url(text) == expected


@pytest.mark.parametrize("override, expected", [
    (f"+ckpt.storage_options.secret={SECRET}", f"+ckpt.storage_options.secret={REDACTED}"),
    ("ckpt.storage_options={key: a, secret: b}", f"ckpt.storage_options={REDACTED}"),
    ("++logger.token=abc", f"++logger.token={REDACTED}"),
    ("ckpt.dir=s3://u:p@h/b", "ckpt.dir=s3://***@h/b"),
    ("model=qcnet", "model=qcnet"),
])
def test_redact_override(override, expected):
    assert redact_override(override) == expected
    assert redact_argv(["-m", override]) == ["-m", expected]


def test_secret_values_and_redact_text():
    values = secret_values({"key": KEY, "secret": SECRET, "client_kwargs": {"token": "tok-abcdef"}, "anon": True,
                            "region": "eu"})
    assert sorted(values) == sorted([KEY, SECRET, "tok-abcdef"])  # short values ("eu") are not credentials
    text = f"403 for {KEY}/{SECRET} at s3://u:{SECRET}@h/b"
    assert redact_text(text, values) == "403 for ***/*** at s3://***@h/b"


def test_log_filter_rewrites_records(tmp_path):
    log_file = tmp_path / "run.log"
    handler = logging.FileHandler(log_file)
    logger = logging.getLogger("drivebench.test_secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        handler.addFilter(RedactingFilter([SECRET]))
        logger.warning("request signed with %s failed", SECRET)
        handler.flush()
        assert SECRET not in log_file.read_text() and "request signed with *** failed" in log_file.read_text()
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_install_log_redaction_reaches_existing_handlers():
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        flt = install_log_redaction([SECRET])
        assert flt in handler.filters
        assert install_log_redaction([]) is None
    finally:
        root.removeHandler(handler)


def test_scrub_hydra_dir_rewrites_configs_and_sweep_file(tmp_path):
    run_dir = tmp_path / "sweep" / "0_qcnet"
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True)
    override = f"+ckpt.storage_options.secret={SECRET}"
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump({"ckpt": {"storage_options": {"secret": SECRET}}}))
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump([override, "model=qcnet"]))
    (hydra_dir / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"overrides": {"task": [override]}, "job": {"override_dirname": f"model=qcnet,{override}"}}}))
    (run_dir.parent / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": [override]}}}))
    (hydra_dir / "clean.yaml").write_text(yaml.safe_dump({"model": "qcnet"}))
    changed = scrub_hydra_dir(run_dir)
    assert sorted(p.name for p in changed) == ["config.yaml", "hydra.yaml", "multirun.yaml", "overrides.yaml"]
    for path in [*hydra_dir.glob("*.yaml"), run_dir.parent / "multirun.yaml"]:
        assert SECRET not in path.read_text(), path
    assert yaml.safe_load((hydra_dir / "overrides.yaml").read_text())[1] == "model=qcnet"


def test_store_errors_never_quote_credentials(tmp_path):
    store = CheckpointStore("memory://secret-bucket/run", {"secret": SECRET, "key": KEY})

    def refuse(path, data):
        raise PermissionError(f"access denied for key {KEY} signed with {SECRET}")

    store._fs.pipe = refuse
    with pytest.raises(CheckpointWriteError) as err:
        store.write("step-00000001.ckpt", {"x": 1})
    assert SECRET not in str(err.value) and KEY not in str(err.value) and "previous checkpoint is intact" in str(err.value)
    with pytest.raises(ConfigError) as err:  # credentials inside the URL itself
        CheckpointStore("nosuchprotocol://AKIA:hunter22@host/b")
    assert "hunter22" not in str(err.value) and "nosuchprotocol://***@host/b" in str(err.value)


def test_credentials_absent_from_every_file_of_a_run(tmp_path_factory, tmp_path):
    cache = shared_cache(tmp_path_factory)
    run_dir = tmp_path / "run"
    proc = train(run_dir, cache, "ckpt=remote", "ckpt.dir=memory://bucket/run", "ckpt.every_n_steps=1",
                 f"+ckpt.storage_options.secret={SECRET}", f"+ckpt.storage_options.key={KEY}", steps=2)
    result = summary(run_dir)
    assert [s["step"] for s in result["checkpoints"]["each"]] == [1, 2]  # the options reached the store
    assert result["checkpoints"]["filesystem"]["kind"] == "fsspec:memory"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.relative_to(run_dir).as_posix() for p in files}
    assert {"summary.json", ".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml"} <= names
    assert any(n.endswith(".log") for n in names) and any("tfevents" in n for n in names)
    for path in files:
        raw = path.read_bytes()
        assert SECRET.encode() not in raw and KEY.encode() not in raw, f"credential in {path}"
    assert SECRET not in proc.stdout + proc.stderr and KEY not in proc.stdout + proc.stderr
    assert result["config"]["ckpt"]["storage_options"] == {"secret": REDACTED, "key": REDACTED}
    assert f"+ckpt.storage_options.secret={REDACTED}" in result["run"]["command"]


def test_checkpoints_carry_the_resolved_config_without_credentials(tmp_path_factory, tmp_path):
    import torch

    cache = shared_cache(tmp_path_factory)
    run_dir = tmp_path / "run"
    ckpt_dir = run_dir / "ckpts"
    train(run_dir, cache, "ckpt=remote", f"ckpt.dir=file://{ckpt_dir}", "ckpt.every_n_steps=2",
          f"+ckpt.storage_options.secret={SECRET}", steps=2)
    saved = sorted(ckpt_dir.glob("*.ckpt"))
    assert saved, f"no checkpoint in {ckpt_dir}"
    for path in saved:
        assert SECRET.encode() not in path.read_bytes(), f"credential in {path}"
    config = torch.load(saved[-1], weights_only=True)["drivebench_config"]  # loads as plain data
    assert config["model"]["name"] == "qcnet" and config["ckpt"]["dir"] == f"file://{ckpt_dir}"
    assert config["ckpt"]["storage_options"] == {"secret": REDACTED}
    assert config["bench"]["steps"] == 2

"""Where checkpoints live: a local directory or any fsspec URL, with atomic writes.

Atomic means a reader never finds half a checkpoint under its final name:
* local paths: write ``.<name>.partial``, flush + fsync, ``os.replace`` to the final name, fsync
  the directory (a crash at any moment leaves either the old or the new file, never a torn one);
* fsspec URLs: the bytes are assembled in memory and sent in one ``pipe`` (one PUT on object
  stores, which is atomic there); ``file://`` URLs are treated as local paths.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import torch

from drivebench.ckpt.identity import RunIdentity
from drivebench.errors import ConfigError
from drivebench.secrets import redact_text, redact_url, secret_values

log = logging.getLogger(__name__)
# step-<step>.ckpt (written before checkpoints had an identity) or step-<step>-<fingerprint[:8]>-<run id>.ckpt
_NAME = re.compile(r"^step-(\d+)(?:-([0-9a-f]{8})-([0-9a-z]{8}))?\.ckpt$")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous complete checkpoint is untouched.

    ``full``: the disk was full (or a file-size limit was reached); ``remote``: an fsspec store failed. The
    checkpoint IO, which knows this run's previous checkpoint, adds what to do next (:meth:`with_advice`)."""

    def __init__(self, message: str, full: bool = False, remote: bool = False) -> None:
        super().__init__(message)
        self.full = full
        self.remote = remote

    def with_advice(self, advice: str) -> "CheckpointWriteError":
        err = CheckpointWriteError(f"{self}. {advice}", self.full, self.remote)
        err.__cause__ = self.__cause__
        return err


def partial_name(name: str) -> str:
    """The hidden file a local write streams into before its rename: unique per writing process."""
    return f".{name}.{os.getpid()}.partial"


@dataclass
class WriteResult:
    path: str
    bytes: int
    write_s: float


@dataclass(frozen=True)
class CheckpointFile:
    """A complete checkpoint in a store, as its name describes it (``fingerprint``/``run_id``: None for the
    names written before checkpoints had an identity)."""

    step: int
    path: str
    fingerprint: str | None = None   # the first 8 hex digits
    run_id: str | None = None
    mtime: float | None = None       # local files only

    def belongs_to(self, identity: RunIdentity | None) -> bool:
        """Written by this run (same fingerprint and run id); without an identity, the unnamed files are one's own."""
        if identity is None:
            return self.run_id is None
        return self.run_id == identity.run_id and self.fingerprint == identity.short

    def trains_like(self, identity: RunIdentity) -> bool:
        """Its name says it trains what ``identity`` trains (the full fingerprint is in the file)."""
        return self.fingerprint == identity.short


def checkpoint_name(step: int, identity: RunIdentity | None = None) -> str:
    if identity is None:
        return f"step-{step:08d}.ckpt"
    return f"step-{step:08d}-{identity.short}-{identity.run_id}.ckpt"


def parse_name(name: str) -> tuple[int, str | None, str | None] | None:
    """(step, fingerprint[:8], run id) of a checkpoint's file name, or None for any other name."""
    match = _NAME.match(name)
    return (int(match.group(1)), match.group(2), match.group(3)) if match else None


def step_of(name: str) -> int | None:
    parsed = parse_name(name)
    return parsed[0] if parsed else None


class CheckpointStore:
    """Args:
        dir: a local directory or an fsspec URL (``s3://bucket/run``, ``memory://run``, ``file:///x``).
        storage_options: fsspec options (credentials); never logged or recorded.
    """

    def __init__(self, dir: str, storage_options: dict[str, Any] | None = None) -> None:
        parsed = urlparse(str(dir))
        self.url = redact_url(str(dir))  # what messages and the summary show
        self._secrets = secret_values(storage_options or {})
        self._options = dict(storage_options or {})
        self.protocol = parsed.scheme if len(parsed.scheme) > 1 else "file"  # "C:\" is not a scheme
        self.local = self.protocol == "file"
        self.path = Path(parsed.path if parsed.scheme == "file" else str(dir)) if self.local else None
        self._fs = None
        self._root = str(dir)
        if not self.local:
            import fsspec

            try:
                self._fs, self._root = fsspec.core.url_to_fs(str(dir), **(storage_options or {}))
            except (ImportError, ValueError, TypeError) as err:
                raise ConfigError(self._clean(
                    f"ckpt.dir={self.url}: no filesystem for protocol {self.protocol!r} ({err}); install its fsspec "
                    "backend (e.g. s3fs, gcsfs) or use a local directory")) from err

    # ---- preflight ---------------------------------------------------------------------------
    def prepare(self, needed_bytes: int | None = None) -> None:
        """Create the directory, prove it is writable and (locally) that it has room."""
        if self.local:
            assert self.path is not None
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                probe = self.path / f".write-probe-{os.getpid()}"
                probe.write_bytes(b"ok")
                probe.unlink()
            except OSError as err:
                raise ConfigError(f"ckpt.dir={self.path} is not writable ({err.strerror or err}); choose a "
                                  "writable directory or ckpt=none") from err
            if needed_bytes:
                free = self.free_bytes()
                if free is not None and free < needed_bytes:
                    raise ConfigError(
                        f"ckpt.dir={self.path} has {free / 2**20:.0f} MiB free but the checkpoints of this run need "
                        f"about {needed_bytes / 2**20:.0f} MiB (keep_last_k + 1 checkpoints); free space, lower "
                        "ckpt.keep_last_k, or choose another ckpt.dir"
                    )
        else:
            try:
                self._fs.makedirs(self._root, exist_ok=True)
                probe = f"{self._root.rstrip('/')}/.write-probe-{os.getpid()}"
                self._fs.pipe(probe, b"ok")
                self._fs.rm(probe)
            except Exception as err:  # fsspec backends raise many kinds
                raise ConfigError(self._clean(
                    f"ckpt.dir={self.url} is not writable ({type(err).__name__}: {err}); check the URL and "
                    "ckpt.storage_options")) from err

    def free_bytes(self) -> int | None:
        """Bytes free for this process in a local directory (None for a URL: object stores do not say)."""
        if not self.local:
            return None
        assert self.path is not None
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    # ---- write / list / read -----------------------------------------------------------------
    def write(self, name: str, checkpoint: dict[str, Any],
              fault: Callable[[str, int], None] | None = None) -> WriteResult:
        """Serialise ``checkpoint`` to ``name`` atomically; raise CheckpointWriteError on failure."""
        t0 = time.perf_counter()
        if self.local:
            return self._write_local(name, checkpoint, fault, t0)
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        target = f"{self._root.rstrip('/')}/{name}"
        try:
            self._fs.pipe(target, buf.getvalue())
        except Exception as err:  # fsspec backends raise many kinds
            raise CheckpointWriteError(self._clean(
                f"writing checkpoint {self._url(target)} failed ({type(err).__name__}: {err}); the previous "
                "checkpoint is intact"), remote=True) from err
        return WriteResult(self._url(target), buf.tell(), time.perf_counter() - t0)

    def _write_local(self, name: str, checkpoint: dict[str, Any], fault: Callable[[str, int], None] | None,
                     t0: float) -> WriteResult:
        assert self.path is not None
        final = self.path / name
        tmp = self.path / partial_name(name)
        done = False
        try:
            with open(tmp, "wb") as fh:
                out = _GuardedFile(fh)
                try:
                    if fault is None:
                        torch.save(checkpoint, out)
                    else:  # fault injection for the crash-safety tests: write half, then call back
                        buf = io.BytesIO()
                        torch.save(checkpoint, buf)
                        data = buf.getvalue()
                        out.write(data[: len(data) // 2])
                        fh.flush()
                        fault(str(tmp), len(data))
                        out.write(data[len(data) // 2:])
                except RuntimeError as err:
                    # torch.save wraps the file's OSError (ENOSPC, EFBIG) in a RuntimeError: unwrap it
                    if out.error is None:
                        raise
                    raise out.error from err
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            done = True
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
            hint = "the disk is full (or a file-size limit was reached)" if full else err.strerror or str(err)
            raise CheckpointWriteError(
                f"writing checkpoint {final} failed: {hint}; the previous checkpoint is intact", full=full) from err
        finally:
            if not done:
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
        _fsync_dir(self.path)  # makes the rename durable; best effort (some filesystems refuse)
        return WriteResult(str(final), final.stat().st_size, time.perf_counter() - t0)

    def path_of(self, name: str) -> str:
        """The full path or URL a checkpoint named ``name`` has in this store (as ``write`` reports it)."""
        if self.local:
            assert self.path is not None
            return str(self.path / name)
        return self._url(f"{self._root.rstrip('/')}/{name}")

    def list_steps(self) -> list[tuple[int, str]]:
        """Complete checkpoints as (step, full path or URL), oldest first (every run's)."""
        return [(f.step, f.path) for f in self.list_checkpoints()]

    def list_checkpoints(self) -> list[CheckpointFile]:
        """Complete checkpoints of every run, by step (then path)."""
        found: list[CheckpointFile] = []
        if self.local:
            assert self.path is not None
            if not self.path.is_dir():
                return []
            for p in self.path.iterdir():
                parsed = parse_name(p.name)
                if parsed is not None:
                    try:
                        mtime = p.stat().st_mtime
                    except OSError:  # pruned by its own run meanwhile
                        continue
                    found.append(CheckpointFile(parsed[0], str(p), parsed[1], parsed[2], mtime))
        else:
            try:
                names = self._fs.ls(self._root, detail=False)
            except FileNotFoundError:
                return []
            for n in names:
                parsed = parse_name(n.rsplit("/", 1)[-1])
                if parsed is not None:
                    found.append(CheckpointFile(parsed[0], self._url(n), parsed[1], parsed[2]))
        return sorted(found, key=lambda f: (f.step, f.path))

    def delete(self, path: str) -> None:
        if self.local:
            Path(path).unlink(missing_ok=True)
        else:
            self._fs.rm(self._strip(path))

    def load(self, path: str, weights_only: bool = True) -> dict[str, Any]:
        """Read a checkpoint the way a resume does (``weights_only=True``), onto the CPU."""
        if self.local:
            return torch.load(path, map_location="cpu", weights_only=weights_only)
        with self._fs.open(self._strip(path), "rb") as fh:
            return torch.load(io.BytesIO(fh.read()), map_location="cpu", weights_only=weights_only)

    def loadable(self, path: str) -> bool:
        """True if the file deserialises as Lightning will read it (guards against corruption the
        atomic write cannot see, and against content a ``weights_only`` load refuses)."""
        try:
            self.load(path)
            return True
        except Exception as err:
            log.warning("checkpoint %s does not load (%s: %s)", path, type(err).__name__, self._clean(str(err))[:200])
            return False

    def exists(self, path: str) -> bool:
        if self.local:
            return Path(path).is_file()
        try:
            return bool(self._fs.isfile(self._strip(path)))
        except Exception:
            return False

    def same_filesystem(self, path: str) -> bool:
        """True if ``path`` is a URL of this store's protocol (so its storage options apply)."""
        scheme = urlparse(str(path)).scheme
        return (scheme if len(scheme) > 1 else "file") == self.protocol

    def latest_complete(self) -> str | None:
        """Newest checkpoint that loads; skips (and names) any that do not."""
        for _, path in reversed(self.list_steps()):
            if self.loadable(path):
                return path
        return None

    def describe(self) -> dict[str, Any]:
        from drivebench.perf.machine import filesystem_of

        if self.local:
            assert self.path is not None
            info = filesystem_of(self.path)
            info["kind"] = _kind(info.get("fstype"))
            return info
        return {"path": self.url, "protocol": self.protocol, "kind": f"fsspec:{self.protocol}"}

    def _url(self, name: str) -> str:
        return name if "://" in name else f"{self.protocol}://{name}"

    def _strip(self, path: str) -> str:
        return path.split("://", 1)[1] if "://" in path else path

    def _clean(self, text: str) -> str:
        return redact_text(text, self._secrets)


def store_for(path: str, like: CheckpointStore | None = None) -> CheckpointStore:
    """A store for the directory of ``path`` (a checkpoint to read), with ``like``'s storage options
    when ``path`` is on ``like``'s filesystem (so ``resume=s3://...`` reads with ``ckpt.storage_options``)."""
    path = str(path)
    parent = path.rsplit("/", 1)[0] if "/" in path else "."
    options = like._options if like is not None and like.same_filesystem(path) else None
    return CheckpointStore(parent, options)


class _GuardedFile:
    """A file wrapper for ``torch.save`` that remembers the OSError it raised: torch re-raises write
    failures as a RuntimeError, and the errno (disk full, file too large) is what the user needs."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._fh.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self._fh.flush()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kind(fstype: str | None) -> str:
    from drivebench.perf.machine import is_network_fs

    if not fstype:
        return "unknown"
    if fstype in ("tmpfs", "ramfs"):
        return "tmpfs (memory)"
    if is_network_fs(fstype):
        return "network or FUSE mount"
    return "local disk"

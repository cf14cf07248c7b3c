"""Errors for bad nuScenes data: each names the file, the sample token and what to do."""

from __future__ import annotations

from drivebench.errors import DataError


def _rebuild(cls: type, state: dict) -> "DataFileError":
    err = cls.__new__(cls)
    DataError.__init__(err, state.pop("_message"))
    err.__dict__.update(state)
    return err


class DataFileError(DataError):
    """A file a sample needs is missing or unreadable.

    ``path`` is the file, ``sample_token`` the key frame that needs it (``""`` when the file belongs
    to the whole dataset, e.g. a table).
    """

    def __init__(self, path: str, sample_token: str, problem: str, fix: str = "") -> None:
        self.path = str(path)
        self.sample_token = sample_token
        self.problem = problem
        where = f" (sample {sample_token})" if sample_token else ""
        hint = f"; {fix}" if fix else ""
        super().__init__(f"{problem}: {self.path}{where}{hint}")

    def __reduce__(self) -> tuple:
        """Picklable whatever a subclass's arguments (a process pool sends it back to the parent)."""
        return _rebuild, (type(self), {**self.__dict__, "_message": str(self)})


class MissingTableError(DataFileError):
    """One of the 13 nuScenes tables is absent: the devkit cannot load the version."""

    def __init__(self, path: str) -> None:
        super().__init__(
            path,
            "",
            "nuScenes table missing",
            "restore it from the nuScenes download, or delete the root so the embedded set is regenerated",
        )


class CorruptFileError(DataFileError):
    """A file exists but its content is not what its format requires."""

    def __init__(self, path: str, sample_token: str, problem: str) -> None:
        super().__init__(
            path,
            sample_token,
            problem,
            "re-download or regenerate the file, or set data.on_corrupt=skip to drop the sample",
        )


class MissingFileError(DataFileError):
    def __init__(self, path: str, sample_token: str, kind: str) -> None:
        super().__init__(
            path,
            sample_token,
            f"{kind} file missing",
            "check data.root points at a complete nuScenes copy, or set data.on_corrupt=skip to drop the sample",
        )

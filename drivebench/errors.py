"""The one error type a user sees for bad input: one line naming the key or file and the fix."""


class ConfigError(ValueError):
    """A configuration value, path or file that cannot work; raised before any compute is spent."""


def bad_choice(key: str, value: object, choices: list[str] | tuple[str, ...]) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


class DataError(RuntimeError):
    """A data file that is missing or not in its format; the message names the file and the fix. Reported
    like a ConfigError (one line, exit code 2) wherever it is raised: preparing the data, in a loader
    worker, mid-training."""


class MissingDataError(DataError, FileNotFoundError):
    """A data file or folder that is not there (also a FileNotFoundError, for callers that catch that)."""


def load_json(path: object) -> object:
    """``json.load`` of a dataset file, or a DataError naming the file (JSONDecodeError names only a column)."""
    import json
    from pathlib import Path

    path = Path(str(path))
    try:
        with open(path, "rb") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise MissingDataError(f"{path} does not exist") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise DataError(f"{path} is not valid JSON ({json_reason(err)}); the file is truncated or damaged: "
                        "restore it from the dataset's download, or regenerate it") from None


def json_reason(err: BaseException) -> str:
    """Where a JSON document broke, in words (``Expecting ',' delimiter at line 1 column 583902``)."""
    msg = getattr(err, "msg", None)
    if msg is not None and hasattr(err, "lineno"):
        return f"{msg} at line {err.lineno} column {err.colno}"
    return str(err).splitlines()[0][:200]


def data_error_in_worker(err: BaseException) -> str | None:
    """The message of a :class:`DataError` that a DataLoader worker raised, or None.

    torch re-raises a worker's exception in the training process by its type and a message holding the
    worker's traceback; a DataError (whose constructor may take several arguments) comes back as a
    RuntimeError with that text. Its last line is ``<module>.<Class>: <message>``."""
    import importlib

    text = str(err)
    if " in DataLoader worker process " not in text.split("\n", 1)[0]:
        return None
    last = [line for line in text.splitlines() if line.strip()][-1]
    qualified, sep, message = last.partition(": ")
    module, _, name = qualified.rpartition(".")
    if not sep or not module:
        return None
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return message if isinstance(cls, type) and issubclass(cls, DataError) else None

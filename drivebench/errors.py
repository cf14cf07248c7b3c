"""The one error type a user sees for bad input: one line naming the key or file and the fix."""


class ConfigError(ValueError):
    """A configuration value, path or file that cannot work; raised before any compute is spent."""


def bad_choice(key: str, value: object, choices: list[str] | tuple[str, ...]) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")

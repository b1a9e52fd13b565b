"""Settings declared once as dataclass fields that are also command-line flags.

A field made with `setting(...)` carries its flag's help, name, group and bounds; `clef-systemone`'s parser and
`--help` are generated from such fields, a command line is written back from them (`command_line`), and the
bounds hold for objects built in Python too: a value out of bounds raises `SettingsError` naming the flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from clef_vllm.errors import SettingsError

_SETTING = "clef_setting"


@dataclass(frozen=True)
class Setting:
    """How one field is given on the command line, and the values it may take."""

    help: str
    flag: str | None = None  # default --field-name, or --no-field-name for a switch that is on by default
    group: str | None = None  # a titled section of --help
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    env: str | None = None  # read when the flag is not given
    show_default: bool = True  # False where the help says what the default is


def setting(default: Any = dataclasses.MISSING, /, help: str = "", **how: Any) -> Any:
    """A dataclass field that is also a flag; without a default the flag is required."""
    return field(default=default, metadata={_SETTING: Setting(help, **how)})


def setting_of(config_field: dataclasses.Field[Any]) -> Setting | None:
    return config_field.metadata.get(_SETTING)


def flag_of(config_field: dataclasses.Field[Any]) -> str:
    """The flag that sets `config_field`."""
    how = setting_of(config_field)
    if how is not None and how.flag:
        return how.flag
    name = config_field.name.replace("_", "-")
    return f"--no-{name}" if config_field.default is True else f"--{name}"


def out_of_bounds(config_field: dataclasses.Field[Any], value: Any) -> str | None:
    """Why `value` is refused for `config_field` (one line naming the flag), or None when it is within bounds."""
    how = setting_of(config_field)
    if how is None or value is None or isinstance(value, bool):
        return None
    flag = flag_of(config_field)
    if how.at_least is not None and value < how.at_least:
        return f"{flag} must be >= {how.at_least:g}, not {value}"
    if how.above is not None and value <= how.above:
        return f"{flag} must be > {how.above:g}, not {value}"
    if how.at_most is not None and value > how.at_most:
        return f"{flag} must be at most {how.at_most:g}, not {value}"
    return None


def check_bounds(settings: Any) -> None:
    """Raise `SettingsError` for the first field of `settings` whose value is out of its flag's bounds."""
    for config_field in dataclasses.fields(settings):
        problem = out_of_bounds(config_field, getattr(settings, config_field.name))
        if problem is not None:
            raise SettingsError(problem)


def command_line(settings: Any) -> list[str]:
    """The flags that give `settings` from their defaults: a required field always, any other only where its value
    differs from the default (a switch as its flag, a repeatable field once per value)."""
    words: list[str] = []
    for config_field in dataclasses.fields(settings):
        how = setting_of(config_field)
        value = getattr(settings, config_field.name)
        if how is None:
            continue
        if config_field.default is not dataclasses.MISSING and value == config_field.default:
            continue
        flag = flag_of(config_field)
        if isinstance(value, bool):
            words.append(flag)
        elif isinstance(value, tuple):
            words += [word for item in value for word in (flag, str(item))]
        elif value is not None:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return words

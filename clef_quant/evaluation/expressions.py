"""The two expression languages of task files: Jinja2 (`expressions: jinja2`) and the older brace syntax.

What a task author writes in each is described in `tasks.py`. The rules the languages share (keys compared as text,
ids paired with descriptions, class names, images) are written once here, so that a file gives the same request
whichever language it is written in.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from itertools import chain, islice
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.nativetypes import NativeCodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from clef_quant.evaluation.errors import RowError, TaskFileError

Row = Mapping[str, Any]
LabelNames = Mapping[str, list[str]]  # ClassLabel column -> class names

JINJA2 = "jinja2"

# -- the rules both languages share ----------------------------------------------------------------------------


def readable(value: Any) -> str:
    """A dataset's identifier-like text (`high_school_physics`) as words."""
    return str(value).replace("_", " ").strip()


def key_text(value: Any) -> str:
    """Table keys and row values compare as text; YAML reads `true:` as a bool and `0:` as an int."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def lookup(value: Any, table: Mapping[Any, Any]) -> Any:
    """The entry of `table` for `value`, keys compared as text."""
    entries = {key_text(key): entry for key, entry in table.items()}
    key = key_text(value)
    if key not in entries:
        raise RowError(f"{key!r} has no entry in the table ({', '.join(entries)})")
    return entries[key]


def criteria(ids: Any, descriptions: Any) -> dict[str, Any]:
    """Option id -> description, for choice criteria taken from a row."""
    if not isinstance(ids, list | tuple) or not isinstance(descriptions, list | tuple):
        raise RowError(
            f"ids and descriptions must be two lists, not {type(ids).__name__} and {type(descriptions).__name__}"
        )
    # The row decides how many options there are (ARC has 3 to 5); ids beyond the descriptions are unused.
    if len(ids) < len(descriptions):
        raise RowError(f"{len(descriptions)} descriptions but only {len(ids)} ids")
    return {str(i): d for i, d in zip(ids, descriptions, strict=False)}


def class_name(column: str, value: Any, names: LabelNames) -> str:
    """The class name of a ClassLabel column's value."""
    if column not in names:
        raise TaskFileError(f"column {column!r} is not a ClassLabel in this dataset, so its values have no names")
    if not isinstance(value, int) or not 0 <= value < len(names[column]):
        raise RowError(f"{column}={value!r} is not a class index of {len(names[column])} names")
    return names[column][value]


def png_base64(value: Any) -> str:
    """A `datasets` Image value as base64 PNG, for a request's `images`; a row without one does not fit."""
    if value is None:
        raise RowError("the row has no image")
    if isinstance(value, Mapping):  # an undecoded Image feature: {"bytes", "path"}
        if not value.get("bytes"):
            raise RowError("the row has no image bytes")
        return base64.b64encode(value["bytes"]).decode("ascii")
    if not hasattr(value, "save"):
        raise RowError(f"a {type(value).__name__} is not an image")
    buffer = io.BytesIO()
    value.convert("RGB").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _column(row: Row, path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise TaskFileError(f"the row has no column {path!r}")
        value = value[part]
    return value


# -- walking a section -----------------------------------------------------------------------------------------


class Expressions:
    """How the strings and objects of one task file's `request` and `gold` become values for one row; lists and
    objects are evaluated item by item, numbers and booleans are kept as they are."""

    def evaluate(self, expr: Any, row: Row, names: LabelNames) -> Any:
        if isinstance(expr, str):
            return self.string(expr, row, names)
        if isinstance(expr, list):
            return [self.evaluate(item, row, names) for item in expr]
        if isinstance(expr, dict):
            return self.mapping(expr, row, names)
        return expr

    def string(self, expr: str, row: Row, names: LabelNames) -> Any:
        raise NotImplementedError

    def mapping(self, expr: dict[Any, Any], row: Row, names: LabelNames) -> Any:
        return {str(key): self.evaluate(value, row, names) for key, value in expr.items()}


def _strings(section: Any) -> Iterator[str]:
    if isinstance(section, str):
        yield section
    elif isinstance(section, list):
        for item in section:
            yield from _strings(item)
    elif isinstance(section, dict):
        for value in section.values():
            yield from _strings(value)


def _operator_keys(section: Any) -> Iterator[str]:
    if isinstance(section, list):
        for item in section:
            yield from _operator_keys(item)
    elif isinstance(section, dict):
        yield from (key for key in section if isinstance(key, str) and key.startswith("$"))
        for value in section.values():
            yield from _operator_keys(value)


# -- Jinja2 ----------------------------------------------------------------------------------------------------

_LABEL_NAMES = "__clef_label_names"  # how label_name() reaches the class names: a name no dataset column has


class _TaskEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with jinja2.nativetypes' code generator: an expression's output is its value, not its str()."""

    code_generator_class = NativeCodeGenerator


def _value_or_text(chunks: Iterator[Any]) -> Any:
    """A template that is one expression gives its value as it is, text around it makes the whole a string.

    Not `jinja2.nativetypes.native_concat`: it parses a string result as a Python literal, so a row whose text is
    "42" or "[1, 2]" would become a number or a list, and the request would differ from the old syntax's.
    """
    head = list(islice(chunks, 2))
    if len(head) == 1:
        return head[0]
    return "".join(str(chunk) for chunk in chain(head, chunks))


def _defined(value: Any) -> Any:
    """`value` when nothing in it is undefined. Native output does not turn a value into text, where StrictUndefined
    would raise, so a missing struct field or list item would otherwise reach the request as an object."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises here, naming what is missing
    elif isinstance(value, list | tuple):
        for item in value:
            _defined(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            _defined(item)
    return value


def _criteria(ids: Any, descriptions: Any) -> dict[str, Any]:
    return criteria(_defined(ids), _defined(descriptions))


@jinja2.pass_context
def _label_name(context: jinja2.runtime.Context, column: str) -> str:
    names = context.get(_LABEL_NAMES, {})
    if column not in names:  # checked first: a column that is no ClassLabel is the file's mistake on every row
        return class_name(column, None, names)
    value = context.resolve_or_missing(column)
    if value is jinja2.utils.missing:
        raise TaskFileError(f"the row has no column {column!r}")
    return class_name(column, value, names)


FILTERS = {"readable": readable, "lookup": lookup, "png_base64": png_base64}
GLOBALS = {"criteria": _criteria, "label_name": _label_name}


@cache
def environment() -> jinja2.Environment:
    """The environment every Jinja2 task file is rendered in (shared: it holds no state of a file or row)."""
    env = _TaskEnvironment(
        undefined=jinja2.StrictUndefined,  # a misspelt column is an error naming it, never an empty string
        keep_trailing_newline=True,  # a YAML block scalar keeps its final newline, as in the old syntax
        autoescape=False,  # request text, not HTML
        finalize=_defined,
    )
    env.filters.update(FILTERS)
    env.globals.update(GLOBALS)
    return env


class JinjaExpressions(Expressions):
    """The templates of one `expressions: jinja2` task file, compiled when the file is loaded, so a syntax error
    or an unknown filter is found before any row is read."""

    def __init__(self, sections: Iterable[Any]) -> None:
        sections = list(sections)
        operators = sorted(set(chain.from_iterable(_operator_keys(section) for section in sections)))
        if operators:
            raise TaskFileError(
                f"{', '.join(operators)} belong(s) to the old syntax; an `expressions: {JINJA2}` file writes them "
                f"as Jinja2 (filters {', '.join(FILTERS)}; functions {', '.join(GLOBALS)})"
            )
        env = environment()
        self._templates: dict[str, tuple[jinja2.Template, frozenset[str]]] = {}
        for source in chain.from_iterable(_strings(section) for section in sections):
            if source not in self._templates:
                self._templates[source] = _compiled(env, source)

    def string(self, expr: str, row: Row, names: LabelNames) -> Any:
        template, variables = self._templates[expr]
        missing = sorted(name for name in variables if name not in row)
        if missing:
            raise TaskFileError(f"{expr!r}: the row has no column {missing[0]!r}")
        try:
            return _value_or_text(template.generate({**row, _LABEL_NAMES: names}))
        except RowError as exc:
            raise RowError(f"{expr!r}: {exc}") from None
        except TaskFileError as exc:
            raise TaskFileError(f"{expr!r}: {exc}") from None
        except jinja2.TemplateError as exc:  # undefined struct fields, the sandbox's refusals: wrong for every row
            raise TaskFileError(f"{expr!r}: {_one_line(exc)}") from None
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # the expression meets this row's values
            raise RowError(f"{expr!r}: {type(exc).__name__}: {_one_line(exc)}") from None


def _compiled(env: jinja2.Environment, source: str) -> tuple[jinja2.Template, frozenset[str]]:
    """The template and the variables it reads from the row (those not set inside it, nor provided by us)."""
    try:
        parsed = env.parse(source)
        template = env.from_string(parsed)
    except jinja2.TemplateSyntaxError as exc:  # unknown filters too (TemplateAssertionError)
        known = f" (ours: {', '.join(FILTERS)}, with Jinja2's own)" if "filter" in str(exc.message) else ""
        raise TaskFileError(f"{source!r}: Jinja2 error: {_one_line(exc)}{known}") from None
    return template, frozenset(meta.find_undeclared_variables(parsed) - env.globals.keys())


def _one_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return " ".join(str(message).split())


# -- the old brace syntax --------------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|(\w+))?\}")
_LEGACY_FILTERS = {"readable": readable}


class LegacyExpressions(Expressions):
    """`{column}` placeholders in strings and `{$operator: ...}` objects; still read so older task files work."""

    def string(self, expr: str, row: Row, names: LabelNames) -> str:
        def one(match: re.Match[str]) -> str:
            value = _column(row, match.group(1))
            text = value if isinstance(value, str) else str(value)
            if match.group(2):
                if match.group(2) not in _LEGACY_FILTERS:
                    raise TaskFileError(f"unknown filter |{match.group(2)}; known: {', '.join(_LEGACY_FILTERS)}")
                text = _LEGACY_FILTERS[match.group(2)](text)
            return text

        return _PLACEHOLDER.sub(one, expr)

    def mapping(self, expr: dict[Any, Any], row: Row, names: LabelNames) -> Any:
        operators = [key for key in expr if isinstance(key, str) and key.startswith("$")]
        if not operators:
            return super().mapping(expr, row, names)
        if len(operators) != 1 or operators[0] not in _OPERATORS:
            raise TaskFileError(f"unknown or repeated operator in {expr!r}; known: {', '.join(_OPERATORS)}")
        operator = operators[0]
        try:
            return getattr(self, _OPERATORS[operator])(expr[operator], expr, row, names)
        except RowError as exc:
            raise RowError(f"{operator} {expr[operator]}: {exc}") from None

    def _op_column(self, path: str, expr: dict[str, Any], row: Row, names: LabelNames) -> Any:
        return _column(row, path)

    def _op_label_name(self, column: str, expr: dict[str, Any], row: Row, names: LabelNames) -> str:
        if column not in names:
            return class_name(column, None, names)
        return class_name(column, _column(row, column), names)

    def _op_image(self, column: str, expr: dict[str, Any], row: Row, names: LabelNames) -> str:
        return png_base64(_column(row, column))

    def _op_map(self, path: str, expr: dict[str, Any], row: Row, names: LabelNames) -> Any:
        return self.evaluate(lookup(_column(row, path), expr.get("values") or {}), row, names)

    def _op_zip(self, spec: dict[str, Any], expr: dict[str, Any], row: Row, names: LabelNames) -> dict[str, Any]:
        return criteria(self.evaluate(spec["ids"], row, names), self.evaluate(spec["descriptions"], row, names))


_OPERATORS = {
    "$column": "_op_column",
    "$label_name": "_op_label_name",
    "$map": "_op_map",
    "$zip": "_op_zip",
    "$image": "_op_image",
}

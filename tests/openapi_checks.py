"""Checks of a served /openapi.json against the request models and the limits `parse_request` applies."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator
from typing import Any

import jsonschema
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from clef_vllm.errors import RequestError
from clef_vllm.format import wire_models
from clef_vllm.format.limits import Limits
from clef_vllm.format.request import parse_request
from clef_vllm.format.schema import QuestionType

REQUEST_REF = "#/components/schemas/SystemOneRequest"


def descriptions(value: Any) -> Iterator[str]:
    """Every `description` anywhere in a JSON Schema."""
    if isinstance(value, dict):
        if isinstance(value.get("description"), str):
            yield value["description"]
        for inner in value.values():
            yield from descriptions(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from descriptions(inner)


def field_descriptions(field: FieldInfo) -> Iterator[str]:
    """The field's description and those of the `Field`s inside its annotation, or inside the type it is
    documented as (union members, items)."""
    if field.description:
        yield field.description
    pending: list[Any] = [field.annotation, *field.metadata]
    while pending:
        item = pending.pop()
        if isinstance(item, FieldInfo):
            if item.description:
                yield item.description
            continue
        if (documented := getattr(item, "json_schema_input_type", None)) is not None:
            pending.append(documented)
        pending.extend(typing.get_args(item))


def assert_models_described(spec: dict[str, Any]) -> None:
    """Every request model in the document carries its docstring and, under each field, that field's
    descriptions; the questions cover every question type."""
    schemas = spec["components"]["schemas"]
    models = {
        name: model
        for name in schemas
        if isinstance(model := getattr(wire_models, name, None), type) and issubclass(model, BaseModel)
    }
    assert {"SystemOneRequest", "MediaObject", "NoulCriteria"} <= set(models), sorted(schemas)
    for name, model in models.items():
        assert schemas[name]["description"] == inspect.cleandoc(model.__doc__ or ""), name
        for field_name, field in model.model_fields.items():
            served = schemas[name]["properties"][field.alias or field_name]
            for text in field_descriptions(field):
                assert text in set(descriptions(served)), (name, field_name, text)
    forms = schemas["SystemOneRequest"]["properties"]["questions"]["additionalProperties"]["oneOf"]
    types = {schemas[form["$ref"].rsplit("/", 1)[-1]]["properties"]["type"]["const"] for form in forms}
    assert types == {kind.name.lower() for kind in QuestionType}


def limit_cases(limits: Limits) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(what, a body at a limit, the same body one past it), for every limit `parse_request` applies."""

    def body(questions: dict[str, Any], **media: Any) -> dict[str, Any]:
        return {"state": "s", "questions": questions, **media}

    def noul(count: int) -> dict[str, Any]:
        return {f"q{i}": {"type": "noul"} for i in range(count)}

    def choice(criteria: Any) -> dict[str, Any]:
        return {"q": {"type": "choice", "criteria": criteria}}

    def options(count: int) -> list[str]:
        return [f"o{i}" for i in range(count)]

    def score(count: int) -> dict[str, Any]:
        return {"q": {"type": "score", "criteria": [f"level {i}" for i in range(count)]}}

    def named(length: int) -> str:
        return "x" * length

    yield "questions", body(noul(limits.max_questions)), body(noul(limits.max_questions + 1))
    at, past = limits.max_choice_options, limits.max_choice_options + 1
    yield "choice options", body(choice(dict.fromkeys(options(at), "d"))), body(choice(dict.fromkeys(options(past))))
    yield "choice option names", body(choice(options(at))), body(choice(options(past)))
    fewest = limits.min_options
    yield "fewest options", body(choice(options(fewest))), body(choice(options(fewest - 1)))
    yield "score levels", body(score(limits.max_score_levels)), body(score(limits.max_score_levels + 1))
    longest = limits.max_id_length
    yield "question id", body({named(longest): {"type": "noul"}}), body({named(longest + 1): {"type": "noul"}})
    yield "option id", body(choice([named(longest)])), body(choice([named(longest + 1)]))
    yield (
        "images",
        body(noul(1), images=["aW1n"] * limits.max_images),
        body(noul(1), images=["aW1n"] * (limits.max_images + 1)),
    )
    yield (
        "videos",
        body(noul(1), videos=["dmlk"] * limits.max_videos),
        body(noul(1), videos=["dmlk"] * (limits.max_videos + 1)),
    )


def assert_limits_documented(spec: dict[str, Any], limits: Limits) -> None:
    """At each limit the document and `parse_request` both accept the body; one past it both refuse it."""
    validator = jsonschema.Draft202012Validator({"$ref": REQUEST_REF, "components": spec["components"]})
    for what, at, past in limit_cases(limits):
        parse_request(at, limits)
        assert validator.is_valid(at), (what, next(validator.iter_errors(at)).message)
        try:
            parse_request(past, limits)
        except RequestError:
            pass
        else:
            raise AssertionError(f"{what}: parse_request accepts a body past the limit")
        assert not validator.is_valid(past), f"{what}: the document does not state the limit"

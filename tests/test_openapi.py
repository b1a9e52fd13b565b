"""/openapi.json as an app built on the tiny release serves it, with limits other than the defaults: the request
models' descriptions are in it, and its limits are the ones requests are validated against."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from openapi_checks import assert_limits_documented, assert_models_described

from clef_vllm.format.limits import DEFAULT_LIMITS, Limits

LIMITS = Limits(max_questions=3, max_choice_options=4, max_score_levels=5, max_id_length=6, max_images=2, max_videos=1)


@pytest.fixture(scope="module")
def spec(tiny_dir):
    from openapi_spec_validator import validate

    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import EngineBackend, ServeConfig

    # Each limit away from its default, or the document could be stating the default rather than the server's.
    same = [f.name for f in dataclasses.fields(Limits) if getattr(LIMITS, f.name) == getattr(DEFAULT_LIMITS, f.name)]
    assert set(same) <= {"min_options", "media"}, same
    # The media counts are flags; the other limits have none and come in whole.
    config = ServeConfig(
        model=str(tiny_dir), request_limits=LIMITS, limit_images=LIMITS.max_images, limit_videos=LIMITS.max_videos
    )
    assert config.limits == LIMITS
    app = create_app(EngineBackend(config), start_engine=False)

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.get("/openapi.json")

    document = asyncio.run(get()).json()
    validate(document)
    return document


def test_every_request_model_description_is_in_the_document(spec):
    assert_models_described(spec)


def test_the_document_states_the_limits_requests_are_validated_against(spec):
    assert_limits_documented(spec, LIMITS)


def test_json_values_state_the_strict_parser_limits(spec):
    from clef_vllm.format.strict_json import MAX_DEPTH, MAX_INTEGER_DIGITS

    text = spec["components"]["schemas"]["JsonValue"]["description"]
    assert f"{MAX_DEPTH} levels" in text and f"{MAX_INTEGER_DIGITS} digits" in text
    state = spec["components"]["schemas"]["SystemOneRequest"]["properties"]["state"]
    assert state["$ref"] == "#/components/schemas/JsonValue"

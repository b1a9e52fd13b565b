"""Published clients, installed from the registry, pointed at `clef-systemone` by their base-URL settings.

Workers AI clients (`clef-router`, `clef-evals`) call `/accounts/{id}/ai/run/@cf/cloudflare/{model}` and read
Cloudflare's envelope; SystemOne SDKs (`typesafe-sdk`, `systemone-client`, `avrik-sdk`, `deqio-client`) call
`/v1/systemone` and `/v1/models`. Every answer is compared with the same request sent to `/v1/systemone` directly.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from servers import SHARED_API_KEY

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

API_KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}
STATE = "Customer: I was charged twice for order 1182 and the app crashes when I open the refund page."
QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about a payment?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
}


@pytest.fixture(scope="module")
def url(shared_systemone):
    return shared_systemone.url


def direct(url: str, state, questions, model: str | None = None) -> dict:
    body = {"state": state, "questions": questions, **({"model": model} if model else {})}
    response = httpx.post(f"{url}/v1/systemone", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("selector", ["clef-flash", "clef"])
def test_clef_router_answers_choice_score_and_noul(url, selector):
    from clef_router import ClefRouter

    with ClefRouter(
        account_id="acct", api_token=API_KEY, base_url=url, model_selector=selector, max_retries=0
    ) as router:
        assert router.route_url == f"{url}/accounts/acct/ai/run/@cf/cloudflare/{selector}"
        decision = router.decide(STATE, QUESTIONS)
    expected = direct(url, STATE, QUESTIONS, model=selector)
    assert decision.model == selector
    assert decision.usage.input_tokens == expected["usage"]["input_tokens"]
    answers = expected["answers"]
    assert decision.answers["billing"].noul == answers["billing"]["noul"]
    assert decision.answers["team"].choice == answers["team"]["choice"]
    assert decision.answers["team"].probabilities == answers["team"]["probabilities"]
    assert decision.answers["urgency"].score == answers["urgency"]["score"]
    assert decision.answers["urgency"].probabilities == answers["urgency"]["probabilities"]


def test_clef_router_routes_a_prompt_and_maps_errors(url):
    from clef_router import ClefRouter
    from clef_router.errors import ClefAuthError

    with ClefRouter(account_id="acct", api_token=API_KEY, base_url=url, max_retries=0) as router:
        routing = router.route("Design a distributed rate limiter with exact global quotas.")
    assert routing.tier in {"cheap", "frontier"}
    with (
        ClefRouter(account_id="acct", api_token="wrong", base_url=url, max_retries=0) as router,
        pytest.raises(ClefAuthError) as info,
    ):
        router.decide(STATE, QUESTIONS)
    assert info.value.status_code == 401
    assert "API key" in str(info.value)
    assert info.value.error_code == 401


@pytest.mark.parametrize("model", ["@cf/cloudflare/clef-flash", "@cf/cloudflare/clef"])
def test_clef_evals_answers_choice_score_and_noul(url, model):
    from clef_evals.client import ClefClient
    from clef_evals.config import ClefConfig
    from clef_evals.models import Choice, Noul, Score

    config = ClefConfig(account_id="acct", api_token=API_KEY, base_url=url, model=model, max_retries=0)
    questions = {
        "billing": Noul("Is this about a payment?"),
        "team": Choice("Which team?", {"billing": "money", "tech": "bugs"}),
        "urgency": Score("How urgent?", ["low", "medium", "high"]),
    }
    with ClefClient(config) as client:
        response = client.run(STATE, questions)
    expected = direct(url, STATE, QUESTIONS, model=config.model_selector)
    answers = expected["answers"]
    assert response.model == config.model_selector
    assert response.answers["billing"].probability == answers["billing"]["noul"]
    assert response.answers["team"].choice == answers["team"]["choice"]
    assert response.answers["team"].probabilities == answers["team"]["probabilities"]
    assert response.answers["urgency"].score == answers["urgency"]["score"]
    assert response.answers["urgency"].legend == {0: "low", 1: "medium", 2: "high"}
    assert response.usage.input_tokens == expected["usage"]["input_tokens"]


def test_clef_evals_maps_errors(url):
    from clef_evals.client import ClefClient
    from clef_evals.config import ClefConfig
    from clef_evals.exceptions import ClefAPIError, ClefAuthError
    from clef_evals.models import Noul

    config = ClefConfig(account_id="acct", api_token="wrong", base_url=url, max_retries=0)
    with ClefClient(config) as client, pytest.raises(ClefAuthError):
        client.run(STATE, {"q": Noul("?")})
    config = ClefConfig(account_id="acct", api_token=API_KEY, base_url=url, max_retries=0)
    nested: list = []
    for _ in range(70):
        nested = [nested]
    with ClefClient(config) as client, pytest.raises(ClefAPIError) as info:
        client.run({"deep": nested}, {"q": Noul("?")})
    assert info.value.status_code == 400 and info.value.error_code == 400
    assert "nested" in str(info.value)


PARCEL_PNG = Path(__file__).parents[1] / "examples" / "parcel.png"


def test_typesafe_sdk_sends_an_image_asset(url):
    """The official SDK sends an attached image as a multipart part that the body names with
    `{"type": "image", "part": "asset-0"}`, zstd-compressed; the answer is that of the same image sent as JSON."""
    import httpx2
    from typesafe_sdk import Choice, Image, Noul, RetryPolicy, TypeSafeBadRequestError, TypeSafeClient

    sent: list[httpx2.Request] = []
    http = httpx2.Client(timeout=60, event_hooks={"request": [sent.append]})
    photo = Image(PARCEL_PNG)
    # Over 1 KiB, so that the SDK compresses the body
    state = f"Ticket 1432: the parcel arrived like this: {photo}. " + "It was left out in the rain. " * 40
    questions = {
        "damaged": Noul(instructions="Is the parcel damaged?"),
        "team": Choice(instructions="Which team?", criteria={"shipping": None, "billing": "money"}),
    }
    with TypeSafeClient(
        api_key=API_KEY, base_url=url, model="clef", retry=RetryPolicy(max_retries=0), http_client=http
    ) as client:
        with client.attach_assets(photo):
            response = client.system_one(state=state, questions=questions)
        (model,) = client.models.list().models
        with pytest.raises(TypeSafeBadRequestError) as info:
            client.system_one(state=state, questions={"team": {"type": "choice", "criteria": ["a", "a"]}})
    request = sent[0]
    assert request.headers["content-type"].startswith("multipart/form-data")
    assert request.headers["content-encoding"] == "zstd"
    data = base64.b64encode(PARCEL_PNG.read_bytes()).decode()
    body = {
        "model": "clef",
        "state": state,
        "assets": {str(photo): {"format": "png", "data_base64": data}},
        "questions": {
            "damaged": {"type": "noul", "instructions": "Is the parcel damaged?"},
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"shipping": None, "billing": "money"},
            },
        },
    }
    expected = httpx.post(f"{url}/v1/systemone", json=body, headers=AUTH, timeout=60)
    assert expected.status_code == 200, expected.text
    answers = expected.json()["answers"]
    assert response.model == "clef"
    text_only = httpx.post(f"{url}/v1/systemone", json={**body, "assets": None}, headers=AUTH, timeout=60)
    assert response.usage.input_tokens == expected.json()["usage"]["input_tokens"]
    assert response.usage.input_tokens > text_only.json()["usage"]["input_tokens"]  # the image was read
    assert response.nouls["damaged"].noul == answers["damaged"]["noul"]
    assert response.choices["team"].choice == answers["team"]["choice"]
    assert response.choices["team"].probabilities == answers["team"]["probabilities"]
    assert model.name == "tiny" and len(model.release_date) == 10
    error = info.value
    assert error.status == 400 and "twice" in str(error) and error.request_id.startswith("req_")


def test_systemone_client_with_base_url(url):
    from systemone import Choice, Client, Noul, Score

    with Client(url, api_key=API_KEY) as client:
        response = client.system_one(
            state=STATE,
            questions={
                "billing": Noul("Is this about a payment?"),
                "team": Choice("Which team?", {"billing": "money", "tech": "bugs"}),
                "urgency": Score("How urgent?", ["low", "medium", "high"]),
            },
        )
    expected = direct(url, STATE, QUESTIONS)
    assert response.raw == expected
    assert response.raw["model"] == "tiny"
    assert response.nouls["billing"].noul == expected["answers"]["billing"]["noul"]
    assert response.choices["team"].choice == expected["answers"]["team"]["choice"]


def test_avrik_sdk_lists_models_and_reads_errors(url):
    import avrik_sdk
    from avrik_sdk.errors import AvrikError

    with avrik_sdk.Client(url, api_key=API_KEY) as client:
        (model,) = client.models()
        assert (model.name, bool(model.description), len(model.release_date)) == ("tiny", True, 10)
        with pytest.raises(AvrikError) as info:
            client.decide(STATE, {"team": {"type": "choice", "criteria": ["twice", "twice"]}}, request_id="av-1")
    error = info.value
    assert (error.status, error.code, error.field, error.request_id) == (
        400,
        "invalid_request",
        "questions.team.criteria",
        "av-1",
    )


def test_deqio_client_systemone_and_models(url):
    from deqio_client import DeqioClient

    client = DeqioClient(url)
    answer = client.request("POST", "/v1/systemone", {"state": STATE, "questions": QUESTIONS}, headers=AUTH)
    assert answer == direct(url, STATE, QUESTIONS)
    listing = client.request("GET", "/v1/models", headers=AUTH)
    assert listing["models"][0]["name"] == listing["data"][0]["id"] == "tiny"

"""The server's pure pieces without an engine: strict JSON, body decoders, model names, the JSON 500."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import logging
import re
import zlib
from pathlib import Path

import httpx
import pytest
import zstandard
from raw_json import NOUL, deep

from clef_vllm.errors import RequestError
from clef_vllm.format import strict_json
from clef_vllm.server.body import TooLarge, decoder_for
from clef_vllm.server.error_shape import ApiError
from clef_vllm.server.model_info import model_info

# (raw body, code, field)
REFUSED = [
    pytest.param(b"{not json", "invalid_json", None, id="not-json"),
    pytest.param(b'{"state": "\xff"}', "invalid_json", None, id="not-utf8"),
    pytest.param(b'{"state": NaN, ' + NOUL + b"}", "invalid_number", "state", id="nan"),
    pytest.param(b'{"state": [1, Infinity], ' + NOUL + b"}", "invalid_number", "state[1]", id="infinity"),
    pytest.param(b'{"state": {"x": -Infinity}, ' + NOUL + b"}", "invalid_number", "state.x", id="minus-infinity"),
    pytest.param(b'{"state": 1e400, ' + NOUL + b"}", "invalid_number", "state", id="overflow"),
    pytest.param(b'{"state": [' + b"7" * 5000 + b"], " + NOUL + b"}", "invalid_number", "state[0]", id="5000-digits"),
    pytest.param(b'{"state": "a\\ud800b", ' + NOUL + b"}", "invalid_string", "state", id="lone-high-surrogate"),
    pytest.param(b'{"state": ["\\udc00"], ' + NOUL + b"}", "invalid_string", "state[0]", id="lone-low-surrogate"),
    pytest.param(b'{"model": "\\ud800", "state": 1, ' + NOUL + b"}", "invalid_string", "model", id="surrogate-model"),
    pytest.param(
        b'{"state": 1, "questions": {"\\ud800": {"type": "noul"}}}',
        "invalid_string",
        "questions.\\ud800",
        id="surrogate-question-id",
    ),
    pytest.param(b'{"state": {"a": 1, "a": 2}, ' + NOUL + b"}", "duplicate_key", "state", id="duplicate-state-key"),
    pytest.param(
        b'{"state": 1, "questions": {"q": {"type": "noul"}, "q": {"type": "noul"}}}',
        "duplicate_key",
        "questions",
        id="duplicate-question-id",
    ),
    pytest.param(
        b'{"state": 1, "questions": {"q": {"type": "choice", "criteria": {"x": 1, "x": 2}}}}',
        "duplicate_key",
        "questions.q.criteria",
        id="duplicate-option-id",
    ),
    pytest.param(b'{"state": 1, "state": 2, ' + NOUL + b"}", "duplicate_key", None, id="duplicate-top-level"),
    pytest.param(b'{"state": ' + deep(990) + b", " + NOUL + b"}", "json_too_deep", "state" + "[0]" * 63, id="990-deep"),
    pytest.param(b'{"state": ' + deep(100_000, closed=False), "json_too_deep", "state" + "[0]" * 63, id="unclosed"),
    pytest.param(
        b'{"state": {"a": "[[[[", "b": [' + deep(70) + b"]}, " + NOUL + b"}",
        "json_too_deep",
        "state.b" + "[0]" * 62,
        id="brackets-in-strings-do-not-count",
    ),
]


@pytest.mark.parametrize(("raw", "code", "field"), REFUSED)
def test_strict_json_refuses_naming_the_place(raw, code, field):
    with pytest.raises(RequestError) as info:
        strict_json.loads(raw)
    assert (info.value.code, info.value.field) == (code, field)
    json.dumps(info.value.message, ensure_ascii=False).encode("utf-8")  # the message itself is sendable


ACCEPTED = [
    b'{"state": ' + deep(strict_json.MAX_DEPTH - 1) + b", " + NOUL + b"}",
    b'{"state": "\\ud83d\\ude00 \\"[[[[\\\\", ' + NOUL + b"}",
    b'{"state": "\\\\ud800 is text, not an escape", ' + NOUL + b"}",
    b'{"state": [1.5e300, -0.0, ' + b"9" * 100 + b", true, null], " + NOUL + b"}",
    b'{"state": {"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}, ' + NOUL + b"}",
]


@pytest.mark.parametrize("raw", ACCEPTED)
def test_strict_json_accepts_what_json_allows(raw):
    assert strict_json.loads(raw) == json.loads(raw)


def test_depth_limit_is_exact():
    strict_json.check_depth(deep(strict_json.MAX_DEPTH))
    with pytest.raises(RequestError):
        strict_json.check_depth(deep(strict_json.MAX_DEPTH + 1))


ENCODED = [
    pytest.param("gzip", gzip.compress, id="gzip"),
    pytest.param("deflate", zlib.compress, id="deflate-zlib"),
    pytest.param("deflate", lambda data: zlib.compress(data, wbits=-15), id="deflate-raw"),
    pytest.param("zstd", zstandard.ZstdCompressor().compress, id="zstd"),
    pytest.param("identity", lambda data: data, id="identity"),
]


def decode(encoding: str, data: bytes, limit: int, chunk: int = 4096) -> bytes:
    decoder = decoder_for(encoding)
    out, size = [], 0
    for start in range(0, len(data), chunk):
        piece = decoder.feed(data[start : start + chunk], limit - size)
        size += len(piece)
        out.append(piece)
    decoder.finish()
    return b"".join(out)


@pytest.mark.parametrize(("encoding", "compress"), ENCODED)
def test_decoders_round_trip_and_cap_the_decoded_size(encoding, compress):
    data = json.dumps({"state": ["word"] * 50_000}).encode()
    assert decode(encoding, compress(data), len(data)) == data
    with pytest.raises(TooLarge):
        decode(encoding, compress(data), len(data) - 1)


def test_a_zstd_bomb_stops_at_the_cap():
    bomb = zstandard.ZstdCompressor(level=3).compress(b"\0" * (256 << 20))
    assert len(bomb) < 64 << 10
    with pytest.raises(TooLarge):
        decode("zstd", bomb, 1 << 20)


def test_unknown_encodings_are_415():
    with pytest.raises(ApiError) as info:
        decoder_for("br")
    assert (info.value.status, info.value.code, info.value.field) == (
        415,
        "unsupported_content_encoding",
        "Content-Encoding",
    )


def test_served_name_is_a_name_never_a_path(tmp_path):
    folder = tmp_path / "my-release"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    plain = model_info(str(folder))
    assert plain.name == "my-release"
    assert len(plain.release_date) == 10 and plain.description
    manifest = {
        "format": "clef-quant-manifest/1",
        "source": {"id": "/home/me/clef-flash", "local": True},
        "scheme": "FP8_DYNAMIC",
        "recipe": {},
        "tools": {},
        "calibration": {},
        "run": {"created": "2026-11-30T10:00:00Z"},
        "files": {"config.json": {"sha256": "0" * 64, "size": 2}},
        "card": {"repo_id": "acme/clef-flash-FP8", "created": "2026-12-01T09:00:00Z"},
    }
    # A manifest the typed model refuses says nothing: the folder's own name and dates stand.
    (folder / "clef_quant.json").write_text(json.dumps({**manifest, "files": {"../x": {"sha256": "0", "size": 1}}}))
    assert model_info(str(folder)) == plain
    (folder / "clef_quant.json").write_text(json.dumps(manifest))
    info = model_info(str(folder))
    assert (info.name, info.release_date) == ("acme/clef-flash-FP8", "2026-12-01")
    assert info.description == "clef-flash quantized to FP8_DYNAMIC with clef-quant"
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nmodel_name: Clef Flash FP8\n---\n# card\n")
    assert model_info(str(folder)).name == "Clef Flash FP8"
    assert model_info(str(folder), "chosen").name == "chosen"
    assert model_info("acme/clef-flash").name == "acme/clef-flash"


def test_an_unexpected_error_is_a_json_500_without_internals(tmp_path, caplog):
    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import ServeConfig

    class Broken:
        config = ServeConfig(model=str(tmp_path))
        ready, dead = True, False

        async def score(self, body, parts=None):
            raise RuntimeError("secret internal detail")

        def shutdown(self):
            pass

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(Broken(), start_engine=False))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"state": 1, "questions": {"q": {"type": "noul"}}}
            return await client.post("/v1/systemone", json=body, headers={"X-Request-Id": "trace-me"})

    response = asyncio.run(post())
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "type": "server_error",
            "code": "internal_error",
            "message": "internal error while scoring the request",
            "field": None,
        },
        "detail": "internal error while scoring the request",
        "code": "internal_error",
    }
    assert response.headers["x-request-id"] == "trace-me"
    logged = [r for r in caplog.records if "trace-me" in r.getMessage() and r.exc_info]
    assert logged, "the failure is logged with its request id"


def test_every_route_requires_the_key_unless_listed_open(tiny_dir):
    from fastapi.routing import APIRoute

    from clef_vllm.server.app import OPEN_ROUTES, RequireKey, create_app
    from clef_vllm.server.backend import EngineBackend, ServeConfig

    app = create_app(EngineBackend(ServeConfig(model=str(tiny_dir), api_key="k")), start_engine=False)
    routes = app.fastapi.routes
    assert {route.path for route in routes} >= OPEN_ROUTES, "an open route that the app does not have"
    keyed = []
    for route in routes:
        if route.path in OPEN_ROUTES:
            continue
        checks = [d.call for d in route.dependant.dependencies] if isinstance(route, APIRoute) else []
        assert any(isinstance(check, RequireKey) for check in checks), f"{route.path} is neither keyed nor open"
        keyed += [
            (method, route.path.replace("{account_id}", "a").replace("{name:path}", "clef")) for method in route.methods
        ]
    assert keyed

    async def ask(key: str | None) -> list[int]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return [(await client.request(method, path, headers=headers)).status_code for method, path in keyed]

    assert asyncio.run(ask(None)) == [401] * len(keyed)
    assert 401 not in asyncio.run(ask("k"))  # 503 here: the engine was never started


# -- clef-systemone's settings: one field of ServeConfig each -------------------------------------------------

# The pages that document clef-systemone: the server and its flags, and the media flags.
SERVER_DOCS = [Path(__file__).resolve().parent.parent / "docs" / page for page in ("serve.md", "media.md")]
# A row of a docs table that starts with flags and then a number: "| `--max-body-mb` | 13 | ... |".
NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"
_DEFAULT_ROW = re.compile(rf"^\| (`--[^|]*) \| ({NUMBER})(?: s)?((?: / {NUMBER}(?: s)?)*) \|", re.MULTILINE)


def server_settings() -> list[tuple[dataclasses.Field, str]]:
    from clef_vllm.engine.flags import flag_of, setting_of
    from clef_vllm.server.settings import ServeConfig

    return [(f, flag_of(f)) for f in dataclasses.fields(ServeConfig) if setting_of(f) is not None]


def test_every_server_flag_is_in_the_docs_with_its_default():
    docs = "\n".join(page.read_text(encoding="utf-8") for page in SERVER_DOCS)
    flags = {flag: f.default for f, flag in server_settings()}
    assert [flag for flag in flags if f"`{flag}" not in docs] == []
    checked = 0
    for row in _DEFAULT_ROW.finditer(docs):
        named = re.findall(r"`(--[a-z-]+)", row[1])
        numbers = [row[2], *re.findall(NUMBER, row[3])]
        if len(named) == len(numbers) and all(flag in flags for flag in named):
            for flag, number in zip(named, numbers, strict=True):
                assert float(number.replace(",", "")) == flags[flag], f"the docs say {flag} defaults to {number}"
                checked += 1
    assert checked >= 5  # the body, timeouts and connections rows at least


def given(config_field: dataclasses.Field, kind: type) -> tuple[list[str], object]:
    """Flag arguments that set `config_field` to something other than its default, and that value."""
    from clef_vllm.engine.flags import flag_of

    flag = flag_of(config_field)
    if kind is tuple:  # repeatable: every value, in order
        return [flag, "seed=7", flag, "gpu_memory_utilization=0.5"], ("seed=7", "gpu_memory_utilization=0.5")
    if kind is bool:
        return [flag], not config_field.default
    if kind is str:
        return [flag, "acme/other"], "acme/other"
    from clef_vllm.engine.flags import setting_of

    base = config_field.default if isinstance(config_field.default, (int, float)) else 3
    base = max(base, setting_of(config_field).at_least or base)
    value = kind(base + 1 if kind is int else base + 0.5)
    return [flag, str(value)], value


def test_every_flag_sets_its_field_and_nothing_else():
    import typing

    from clef_vllm.server.cli import parse_args
    from clef_vllm.server.settings import ServeConfig

    hints = typing.get_type_hints(ServeConfig)
    defaults = parse_args(["--model", "m"])
    for config_field, _ in server_settings():
        if config_field.name == "model":
            continue
        hint = hints[config_field.name]
        kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
        argv, value = given(config_field, tuple if typing.get_origin(hint) is tuple else kinds[0])
        config = parse_args(["--model", "m", *argv])
        assert getattr(config, config_field.name) == value, argv
        assert dataclasses.replace(config, **{config_field.name: getattr(defaults, config_field.name)}) == defaults
        # The command line the settings write (what bench and the card start servers with) gives them back.
        assert parse_args(config.command_line()) == config, config.command_line()
    assert defaults.command_line() == ["--model", "m"]


def test_the_media_flags_set_the_request_limits():
    from clef_vllm.server.cli import parse_args

    config = parse_args(["--model", "m", "--limit-videos", "1", "--max-image-pixels", "4096"])
    assert (config.limits.max_images, config.limits.max_videos, config.limits.media.max_image_pixels) == (8, 1, 4096)
    assert parse_args(["--model", "m", "--max-body-mb", "0.5"]).max_body_bytes == 512 * 1024


def test_the_api_key_comes_from_the_environment_when_no_flag_gives_it(monkeypatch):
    from clef_vllm.server.cli import parse_args

    monkeypatch.setenv("CLEF_SYSTEMONE_API_KEY", "from-env")
    assert parse_args(["--model", "m"]).api_key == "from-env"
    assert parse_args(["--model", "m", "--api-key", "given"]).api_key == "given"
    monkeypatch.setenv("CLEF_SYSTEMONE_API_KEY", "")
    assert parse_args(["--model", "m"]).api_key is None


def test_a_config_built_in_python_keeps_the_flags_bounds():
    from clef_vllm.errors import SettingsError
    from clef_vllm.server.settings import ServeConfig

    with pytest.raises(SettingsError, match=r"^--tp must be >= 1, not 0$"):
        ServeConfig(model="m", tensor_parallel_size=0)
    with pytest.raises(SettingsError, match=r"^--idle-timeout must be >= 0, not -1$"):
        ServeConfig(model="m", idle_timeout=-1)
    with pytest.raises(SettingsError, match=r"^--max-body-mb must be >= 0.000976562, not 0.0009$"):
        ServeConfig(model="m", max_body_mb=0.0009)  # under 1 KiB: every request would be refused
    assert ServeConfig(model="m", max_body_mb=1 / 1024).max_body_bytes == 1024


# -- clef-systemone refuses bad flags as clef-quant does: one `error:` line, exit 2 ---------------------------


def refused_line(capsys, call) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "the following arguments are required: --model", id="no-model"),
        pytest.param(["--model", "m", "--port", "http"], "argument --port: invalid int value: 'http'", id="port-text"),
        pytest.param(["--model", "m", "--port", "70000"], "--port must be at most 65535, not 70000", id="port-high"),
        pytest.param(["--model", "m", "--max-connections", "0"], "--max-connections must be >= 1, not 0", id="conns"),
        pytest.param(["--model", "m", "--body-timeout", "0"], "--body-timeout must be > 0, not 0.0", id="timeout"),
        pytest.param(["--model", "m", "--limit-images", "-1"], "--limit-images must be >= 0, not -1", id="images"),
        pytest.param(
            ["--model", "m", "--max-body-mb", "1e-9"], "--max-body-mb must be >= 0.000976562, not 1e-09", id="body-cap"
        ),
        pytest.param(["--model", "m", "--no-such-flag"], "unrecognized arguments: --no-such-flag", id="unknown"),
    ],
)
def test_bad_server_flags_are_one_line(capsys, argv: list[str], message: str) -> None:
    from clef_vllm.server.cli import parse_args

    assert refused_line(capsys, lambda: parse_args(argv)) == f"error: {message}"


def test_a_model_that_is_not_a_release_is_one_line(capsys, tmp_path) -> None:
    from clef_vllm.server.cli import main

    missing = tmp_path / "nowhere" / "at" / "all"
    line = refused_line(capsys, lambda: main(["--model", str(missing)]))
    assert line == f"error: {missing} does not exist and is not a Hub id (ORG/NAME)"
    line = refused_line(capsys, lambda: main(["--model", str(tmp_path)]))
    assert line == f"error: {tmp_path} is not a release folder: it has no config.json"


# -- vLLM's warnings, each once ------------------------------------------------------------------------------


def vllm_record(message: str, level: int = logging.WARNING, name: str = "vllm.v1.worker.cpu_worker"):
    return logging.LogRecord(name, level, "cpu_worker.py", 114, message, None, None)


def test_the_same_warning_twice_is_one_line() -> None:
    import io

    from clef_vllm.engine.vllm_logs import WarningsOnce

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(WarningsOnce())
    for _ in range(2):
        handler.handle(vllm_record("libtcmalloc is not found in LD_PRELOAD."))
        handler.handle(vllm_record("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding"))
        handler.handle(vllm_record("the engine core died", logging.ERROR))
        handler.handle(vllm_record("not ours", name="transformers"))
    assert stream.getvalue().splitlines() == [
        "libtcmalloc is not found in LD_PRELOAD.",
        "the engine core died",
        "not ours",
        "the engine core died",
        "not ours",
    ]


def test_a_record_seen_by_its_logger_and_a_handler_is_judged_once() -> None:
    from clef_vllm.engine.vllm_logs import WarningsOnce

    once = WarningsOnce()
    record = vllm_record("Reset SSM cache type to float32")
    assert once.filter(record) and once.filter(record)  # the logger's filter, then the handler's
    assert not once.filter(vllm_record("Reset SSM cache type to float32"))


def test_starting_twice_installs_one_filter_that_survives_vllm_reconfiguring(monkeypatch) -> None:
    import io

    from vllm import logger as vllm_logger

    from clef_vllm.engine.vllm_logs import WARNINGS_ONCE, show_vllm_warnings_once

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    show_vllm_warnings_once()
    show_vllm_warnings_once()
    vllm = logging.getLogger("vllm")
    assert vllm.filters.count(WARNINGS_ONCE) == 1
    assert all(h.filters.count(WARNINGS_ONCE) == 1 for h in vllm.handlers)

    stream = io.StringIO()
    vllm_logger._configure_vllm_root_logger()  # what every engine start does: a new handler from the defaults
    (handler,) = vllm.handlers
    previous = handler.setStream(stream)
    try:
        for _ in range(2):
            logging.getLogger("vllm.test_start").warning("a warning only a second engine would repeat")
    finally:
        handler.setStream(previous)
    assert stream.getvalue().count("a warning only a second engine would repeat") == 1


def test_warnings_of_a_refused_configuration_are_dropped_and_of_an_accepted_one_shown(monkeypatch) -> None:
    import io

    from vllm import logger as vllm_logger
    from vllm.config.logging import LoggingConfig

    from clef_vllm.engine.vllm_logs import held_vllm_warnings

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    # vLLM's own configuration, recorded as the active one, so that the check below keeps this handler
    vllm_logger.configure_logging(LoggingConfig())
    stream = io.StringIO()
    (handler,) = logging.getLogger("vllm").handlers
    previous = handler.setStream(stream)
    log = logging.getLogger("vllm.test_check")
    try:
        with pytest.raises(ValueError), held_vllm_warnings():
            log.warning("said on the way to a refusal")
            log.error("an error is never held")
            raise ValueError("refused")
        with held_vllm_warnings():
            log.warning("said about an accepted configuration")
            assert "accepted" not in stream.getvalue()  # held until the check is over
    finally:
        handler.setStream(previous)
    assert "said on the way to a refusal" not in stream.getvalue()
    assert stream.getvalue().count("an error is never held") == 1
    assert stream.getvalue().count("said about an accepted configuration") == 1
    assert not [f for f in handler.filters if type(f).__name__ == "_Held"]


def test_shorter_prompts_go_first_in_the_engine_queue_only_when_asked(tiny_dir: Path) -> None:
    from clef_vllm.server.backend import SHORT_PROMPT_TOKENS, EngineBackend, queue_priority
    from clef_vllm.server.cli import parse_args

    classes = [queue_priority(n) for n in (1, SHORT_PROMPT_TOKENS, SHORT_PROMPT_TOKENS + 1, 4096, 4097, 16384)]
    assert classes == [0, 0, 1, 2, 3, 4]  # doublings past the short class; equal classes keep arrival order
    backend = EngineBackend(parse_args(["--model", str(tiny_dir), "--max-model-len", "4096"]))
    backend.configure()  # vLLM's configuration only: nothing is loaded
    assert backend.vllm_config.scheduler_config.policy == "fcfs"  # no ageing in vLLM's queue: not the default
    asked = EngineBackend(
        parse_args(["--model", str(tiny_dir), "--max-model-len", "4096", "--engine-arg", "scheduling_policy=priority"])
    )
    asked.configure()
    assert asked.vllm_config.scheduler_config.policy == "priority"

"""Fuzzing from the service's own OpenAPI: schemathesis generates valid (positive) and invalid
(negative) requests for every documented operation; no answer may be a 5xx, and every answer must
match what the schema documents (status code, content type, headers, body schema).

The app runs in-process over the small engines, with API keys on (so the auth checks run too)
and the configured limits at the schema's own ceilings, so that what the schema calls valid is
refused only for reasons no JSON Schema can express: a language the loaded model does not serve,
``n_best`` over ``beam_size``, a text over the model's token limit, an unknown model name. Those
are the 404 and 422 that positive cases may get (and, for a translated file, what its bytes and
name hold); anything else but a 2xx fails.

schemathesis' pytest integration (``@schema.parametrize`` on a lazily loaded schema) does not run
under pytest 9, and its plugin ends ASGI lifespans after every test; so each test builds its app
and drives Hypothesis over each operation's strategy itself, and counts the cases it ran. The
plugin is off in `make test` and schemathesis is imported where it is used: every pytest process
would import it otherwise, about 1.5 s of each xdist worker's collection.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest
from hypothesis import HealthCheck, given, settings

from service.http.app import create_app
from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS
from tests.service.api.conftest import engines, small_settings

if TYPE_CHECKING:
    import schemathesis
    from schemathesis import APIOperation
    from schemathesis.specs.openapi.schemas import OpenApiSchema

KEY = "fuzz-key"
SHORT_EXAMPLES = 20  # per operation and mode (make test; the full amount: long)
LONG_EXAMPLES = 250
# Invalid cases slow to draw (half a second each: a path name over its maximum length, which every
# one of them is, answered 400), fewer of them in the short run.
SLOW_NEGATIVE = {"GET /download_file/{filename}": 5}


@pytest.fixture
def schema() -> Iterator[OpenApiSchema]:
    import schemathesis
    from schemathesis.config import ChecksConfig
    from schemathesis.python import asgi

    embedder, translator = engines()
    settings_ = small_settings(
        api_keys=[KEY],
        max_items_per_request=HARD_MAX_ITEMS,
        max_chars_per_text=HARD_MAX_CHARS,
        max_queue=2 * HARD_MAX_ITEMS,
        max_body_bytes=16 << 20,
    )
    app = create_app(settings_, {"embed": embedder, "translate": translator})
    refusals = ChecksConfig.from_dict({}).negative_data_rejection.expected_statuses  # schemathesis' own
    config = schemathesis.Config.from_dict(
        {
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "422"]},
                # An invalid case drawn over the body limit is refused for its size first (413).
                "negative_data_rejection": {"expected-statuses": [*refusals, "413"]},
            },
            # LibreTranslate's API answers 400 where /v1 answers 422 (its own contract).
            "operations": [
                {
                    "include-path-regex": "^/(translate|detect)$",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400"]}},
                },
                # A file is refused for what its bytes and name hold, which no JSON Schema says:
                # a format not translated (415), content that is not that format (422), more
                # text than a request may hold (413).
                {
                    "include-path": "/v1/translate/file",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "413", "415", "422"]}
                    },
                },
                {
                    "include-path": "/translate_file",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "413", "415"]}
                    },
                },
                # TEI's API answers 400 for an empty input, as TEI does (``"error_type": "empty"``).
                {
                    "include-path-regex": "^/(embed|similarity|tokenize|decode)?$",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "422"]}
                    },
                },
                # DeepL's API answers 400 where /v1 answers 422, 404 for a glossary or document
                # not found, and refuses a document as /v1/translate/file refuses a file.
                {
                    "include-path-regex": "^/v2/",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "413", "415"]}
                    },
                },
                # Suggestions are off, as LibreTranslate answers them when disabled: always 403.
                {
                    "include-path": "/suggest",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["403"]}},
                },
                # A name the service never gives, or a file gone: LibreTranslate's 400 and 404.
                {
                    "include-path-regex": "^/download_file/",
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404"]}},
                },
            ],
        }
    )
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    # ASGI's message types are wider in FastAPI's annotations than in schemathesis'.
    with asgi.get_client(cast(Any, app)) as client:  # starts the lifespan; models load in the background
        deadline = time.monotonic() + 10
        while client.get("/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.01)
    yield loaded
    asgi.shutdown_lifespans()


def operations(schema: OpenApiSchema) -> list[APIOperation]:
    from schemathesis.core.result import Ok

    loaded = list(schema.get_all_operations())
    assert all(isinstance(result, Ok) for result in loaded), loaded
    return [result.ok() for result in loaded if isinstance(result, Ok)]


# Operations schemathesis draws only a few bodies for, and no invalid one (Hypothesis:
# Unsatisfiable): /suggest and DeepL's POST /v2/usage and /v2/glossary-language-pairs take none,
# TEI's /similarity and / nested or alternative objects. They are fuzzed as far as it goes, not
# counted; their bad shapes are the route tests' (tests/service/api/test_api_tei.py,
# test_api_libretranslate.py).
FEW_INPUTS = {
    "POST /suggest",
    "POST /v2/usage",
    "POST /v2/glossary-language-pairs",
    "POST /similarity",
    "POST /",
}


def _has_inputs(operation: APIOperation) -> bool:
    raw = operation.definition.raw
    return bool(raw.get("parameters") or raw.get("requestBody"))


def fuzz(
    schema: OpenApiSchema, mode_name: str, examples: int, fewer: dict[str, int] | None = None
) -> Counter[str]:
    """Run up to ``examples`` cases per operation (``fewer``: up to its own for an operation
    named there) of schemathesis' generation mode ``mode_name``; raise on the first failing check."""
    from schemathesis import GenerationMode

    mode = GenerationMode(mode_name)
    cases: Counter[str] = Counter()
    statuses: Counter[tuple[str, int]] = Counter()
    for operation in operations(schema):
        if mode is GenerationMode.NEGATIVE and (not _has_inputs(operation) or operation.label in FEW_INPUTS):
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=(fewer or {}).get(operation.label, examples),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"})
            cases[case.operation.label] += 1
            statuses[case.operation.label, response.status_code] += 1

        run()
    print(f"fuzz[{mode.value}]: {cases.total()} cases; by operation and status: {dict(statuses)}")
    return cases


def _check_coverage(schema: OpenApiSchema, cases: Counter[str], examples: int) -> None:
    labels = {operation.label for operation in operations(schema)}
    assert {"POST /v1/translate", "POST /v1/embed", "POST /v1/embeddings", "GET /v1/models"} <= labels
    for label in labels:
        # Hypothesis stops early only when it runs out of inputs
        if label.startswith("POST") and label not in FEW_INPUTS:
            assert cases[label] >= examples // 2, (label, cases[label])


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzz_every_operation(schema: OpenApiSchema, mode: str) -> None:
    cases = fuzz(schema, mode, SHORT_EXAMPLES, SLOW_NEGATIVE if mode == "negative" else None)
    _check_coverage(schema, cases, SHORT_EXAMPLES)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzz_every_operation_long(schema: OpenApiSchema, mode: str) -> None:
    cases = fuzz(schema, mode, LONG_EXAMPLES)
    _check_coverage(schema, cases, LONG_EXAMPLES)

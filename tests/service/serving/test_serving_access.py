"""Who may be served: the API key check every API shares, and readiness."""

from __future__ import annotations

import secrets

import pytest

from service.serving.access import check_api_key, ready
from service.serving.failures import Forbidden, NotReady, ShuttingDown, Unauthorized
from service.serving.runtime import Runtime
from tests.service.api.conftest import small_settings

KEYS = ["key-one", "key-two", "key-three"]


@pytest.mark.parametrize("offered", [[], [None], ["anything"], ["", None, "x"]])
def test_without_configured_keys_anything_passes(offered: list[str | None]) -> None:
    check_api_key([], offered)


@pytest.mark.parametrize("offered", [[], [None], [""], [None, "", None]])
def test_no_key_offered_is_401_asking_for_a_bearer_token(offered: list[str | None]) -> None:
    with pytest.raises(Unauthorized) as refused:
        check_api_key(KEYS, offered)
    assert refused.value.status_code == 401
    assert refused.value.headers == {"WWW-Authenticate": "Bearer"}


@pytest.mark.parametrize("offered", [["key-four"], ["KEY-ONE"], ["key-one "], ["key-on", "key-one2"]])
def test_no_offered_key_matching_is_403_never_echoing_it(offered: list[str | None]) -> None:
    with pytest.raises(Forbidden) as refused:
        check_api_key(KEYS, offered)
    assert refused.value.status_code == 403
    assert not any(key in refused.value.message for key in (*KEYS, *offered) if key)


@pytest.mark.parametrize(
    "offered", [["key-two"], [None, "key-three"], ["wrong", "key-one"], ["", "key-one", None]]
)
def test_any_offered_key_may_match(offered: list[str | None]) -> None:
    check_api_key(KEYS, offered)


def test_every_offered_key_is_compared_with_every_key_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No early exit on a match: how long the check takes says nothing about which key matched."""
    compared: list[tuple[bytes, bytes]] = []
    original = secrets.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(secrets, "compare_digest", spy)
    check_api_key(KEYS, ["key-one", None, "nope"])
    assert sorted(compared) == sorted((g, k.encode()) for g in (b"key-one", b"nope") for k in KEYS)


def test_readiness_follows_the_runtime_state() -> None:
    runtime = Runtime(small_settings())
    with pytest.raises(NotReady, match=r"not ready \(loading\)") as refused:
        ready(runtime)
    assert refused.value.headers == {"Retry-After": "5"}
    runtime.state, runtime.detail = "failed", "no artefacts"
    with pytest.raises(NotReady, match=r"not ready \(failed: no artefacts\)"):
        ready(runtime)
    runtime.state = "ready"
    assert ready(runtime) is runtime
    runtime.state = "draining"
    with pytest.raises(ShuttingDown) as draining:
        ready(runtime)
    assert draining.value.headers == {"Connection": "close"}

"""Each API key's own limits (``TSERVE_API_KEY_QUOTAS``): requests per minute, characters per
minute and characters per day, checked before any work is queued.

Each limit is a token bucket: it holds up to the limit and refills continuously at the limit per
period, so a key may send its whole limit at once and then the limit per period on average (over
any one period, never more than twice the limit). Against fixed windows, a bucket has no edge at
which a key's count drops to zero, its memory is two numbers, and its ``Retry-After`` is exact:
the time the refill takes to cover the request.

A request takes one request and its characters from every bucket of its key, or nothing at all
when any of them is short (429 with ``Retry-After``, counted by limit). A request larger than a
whole bucket could never pass: that is a 422 naming the limit, as waiting would not help.

Used from the event loop only: ``charge`` checks and takes in one synchronous call, so two
requests of one key cannot both spend the same tokens, with no lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from service.metrics import QUOTA_REJECTIONS, QUOTA_USAGE, QuotaLimit, labelled
from service.serving.failures import InvalidRequest, ServiceError, problem
from service.settings import KeyQuota

_PERIOD_S: dict[QuotaLimit, float] = {
    "requests_per_minute": 60.0,
    "characters_per_minute": 60.0,
    "characters_per_day": 86_400.0,
}


class QuotaExceeded(ServiceError, status=429, kind="quota_exceeded"):
    """The key has spent its limit for now; ``Retry-After`` says when the request would pass."""


@dataclass
class _Bucket:
    limit: QuotaLimit
    capacity: int  # the limit, refilled over period_s
    period_s: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.capacity / self.period_s)
        self.updated = now

    def wait_s(self, amount: int) -> float:
        """How long until the bucket holds ``amount`` (0: it does now)."""
        return max(0.0, (amount - self.tokens) * self.period_s / self.capacity)


class QuotaBook:
    """The buckets of every key that has a quota; a key without one is never limited."""

    def __init__(self, quotas: Mapping[str, KeyQuota], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._buckets: dict[str, list[_Bucket]] = {}
        for key, quota in quotas.items():
            self._buckets[key] = [
                _Bucket(limit, capacity, _PERIOD_S[limit], capacity, now)
                for limit in _PERIOD_S
                if (capacity := getattr(quota, limit)) is not None
            ]

    def charge(self, key: str | None, characters: int, field: str) -> None:
        """Take one request and ``characters`` from ``key``'s buckets, or raise without taking
        anything: ``InvalidRequest`` when the request is larger than a whole bucket,
        ``QuotaExceeded`` when a bucket is short for now."""
        buckets = self._buckets.get(key) if key is not None else None
        if not buckets:
            return
        amounts = [1 if b.limit == "requests_per_minute" else characters for b in buckets]
        too_large = [(b, n) for b, n in zip(buckets, amounts, strict=True) if n > b.capacity]
        if too_large:
            bucket, n = too_large[0]
            message = (
                f"{n} characters, more than this API key's {bucket.limit} quota of {bucket.capacity}: "
                "send fewer characters per request"
            )
            raise InvalidRequest([problem("quota_too_small", (field,), message, bucket.capacity)])
        now = self._clock()
        for bucket in buckets:
            bucket.refill(now)
        waits = [(b.wait_s(n), b) for b, n in zip(buckets, amounts, strict=True)]
        wait_s, longest = max(waits, key=lambda w: w[0])
        if wait_s > 0:
            labelled(QUOTA_REJECTIONS, longest.limit).inc()
            retry_after = max(1, math.ceil(wait_s))
            over = f"this API key is over its {longest.limit} quota of {longest.capacity}"
            raise QuotaExceeded(
                f"{over}; retry in {retry_after} s",
                limit=longest.capacity,
                headers={"Retry-After": str(retry_after)},
            )
        for bucket, n in zip(buckets, amounts, strict=True):
            bucket.tokens -= n
            labelled(QUOTA_USAGE, bucket.limit).observe(1 - bucket.tokens / bucket.capacity)

"""Retry spacing (guarantee I9): exponential, bounded, jittered."""

from __future__ import annotations

import random

JITTER = 0.33


def retry_delay(
    attempt: int, min_backoff: float, max_backoff: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one.

    min(max_backoff, min_backoff x 2^(attempt-1)), plus a random jitter of up to 33% of
    that, so that messages that failed together do not all come back together.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based; got {attempt}")
    exponent = min(attempt - 1, 64)  # 2**64 seconds is beyond any max_backoff
    base = min(max_backoff, min_backoff * (2.0**exponent))
    return base + base * JITTER * (rng or random).random()

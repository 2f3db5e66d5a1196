"""The oldest server of each vendor sqlqueue runs on (sqlqueue.E102)."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.checks import CheckMessage, Error

MIN_MYSQL = (8, 0)
MIN_MARIADB = (10, 11)
MIN_SQLITE = (3, 35)
MIN_POSTGRESQL = (14,)


def version_text(numbers: Sequence[int]) -> str:
    return ".".join(str(n) for n in numbers)


def too_old(product: str, version: Sequence[int], minimum: Sequence[int],
            shown: str | None = None) -> CheckMessage | None:
    """sqlqueue.E102: ``product`` ``version`` is older than ``minimum`` (``shown``: the
    version as the server spells it, if not ``version``'s numbers)."""
    if tuple(version[:len(minimum)]) >= tuple(minimum):
        return None
    return Error(
        f"{product} {shown or version_text(version)} is too old for sqlqueue; "
        f"{product} {version_text(minimum)} or newer is required.",
        id="sqlqueue.E102",
    )

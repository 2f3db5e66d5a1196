"""Views served by ``sqlqueue.urls``: ``metrics/`` (Prometheus text;
docs/guides/monitoring.md)."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from sqlqueue.conf import get_settings


def _allowed(request: HttpRequest) -> bool:
    """A user with ``sqlqueue.view_consumerlag``, or a request bearing the configured
    ``SQLQUEUE["METRICS_TOKEN"]`` (compared in constant time)."""
    header = request.headers.get("Authorization", "")
    token = get_settings().METRICS_TOKEN
    if header.startswith("Bearer "):
        # A bearer that does not match is refused even for a logged-in user: a wrong
        # token in a scraper's configuration must show, not pass on a session cookie.
        return bool(token) and hmac.compare_digest(header[len("Bearer "):].encode(),
                                                   token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated
                and user.has_perm("sqlqueue.view_consumerlag"))


@require_GET
@never_cache
@vary_on_headers("Authorization")
def metrics(request: HttpRequest) -> HttpResponse:
    """The queue's state for Prometheus. Never stored by a cache on the way (``no-store``,
    ``private``, and ``Vary: Authorization`` besides the session's ``Cookie``): the
    answer to one scraper's token or one operator's session is not another's."""
    if not _allowed(request):
        return HttpResponseForbidden("Forbidden: needs the sqlqueue.view_consumerlag "
                                     "permission or the SQLQUEUE['METRICS_TOKEN'] bearer token.\n",
                                     content_type="text/plain")
    try:
        from prometheus_client.exposition import choose_encoder
    except ImportError:  # pragma: no cover - the extra is missing
        return HttpResponse("prometheus_client is not installed: pip install "
                            "'django-sqlqueue[metrics]'.\n", status=501,
                            content_type="text/plain")
    from sqlqueue.metrics import gauges_text, queue_state_registry

    _, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(gauges_text(queue_state_registry(),
                                    content_type.startswith("application/openmetrics-text")),
                        content_type=content_type)

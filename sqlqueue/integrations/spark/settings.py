"""From a Django project to the source's options (driver side only: imports Django).

Spark's processes do not read Django settings, so a job that runs inside a Django project
turns them into options once, on the driver::

    spark.read.format("sqlqueue").options(**options_from_settings()).load()
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote


def database_url(alias: str | None = None, *, password: bool = True) -> str:
    """The ``url`` option for a database alias (default: SQLQUEUE['DATABASE']);
    ``password=False``: without the password (give it as the ``password`` option, which
    Spark redacts in plans and its UI)."""
    from django.db import connections

    from sqlqueue.conf import get_settings

    settings: dict[str, Any] = connections[alias or get_settings().DATABASE].settings_dict
    engine = settings["ENGINE"]
    if engine.endswith("sqlite3"):
        name = str(settings["NAME"])
        if not name.startswith("/"):
            import os

            name = os.path.abspath(name)
        return f"sqlite:///{name}"
    if engine.endswith("mysql"):
        scheme, default_port, socket_option = "mysql", "3306", "unix_socket"
    elif engine.endswith(("postgresql", "postgis")):
        scheme, default_port, socket_option = "postgres", "5432", "host"
    else:
        raise ValueError(f"sqlqueue's Spark source supports MySQL/MariaDB, PostgreSQL and "
                         f"SQLite, not {engine}")
    user = quote(str(settings.get("USER") or ""), safe="")
    secret = quote(str(settings.get("PASSWORD") or ""), safe="") if password else ""
    credentials = f"{user}:{secret}@" if secret else (f"{user}@" if user else "")
    host = str(settings.get("HOST") or "127.0.0.1")
    port = str(settings.get("PORT") or default_port)
    name = quote(str(settings["NAME"]), safe="")
    if host.startswith("/"):  # a socket path (PostgreSQL: the socket's directory)
        return f"{scheme}://{credentials}localhost/{name}?{socket_option}={quote(host)}"
    return f"{scheme}://{credentials}{host}:{port}/{name}"


def options_from_settings(alias: str | None = None) -> dict[str, str]:
    """``url`` (without the password), ``password`` if the database has one, and the
    options that mirror SQLQUEUE settings, as the project sets them."""
    from django.db import connections

    from sqlqueue.conf import get_settings

    conf = get_settings()
    secret = connections[alias or conf.DATABASE].settings_dict.get("PASSWORD")
    return {
        "url": database_url(alias, password=False),
        **({"password": str(secret)} if secret else {}),
        "defaultPartitions": str(conf.DEFAULT_PARTITIONS),
        "maxPayloadBytes": str(conf.MAX_PAYLOAD_BYTES),
        "dlqSuffix": conf.DLQ_SUFFIX,
        "maxTransactionAge": f"{conf.MAX_TRANSACTION_AGE:g}",
        "leaseDuration": f"{conf.LEASE_DURATION:g}",
        "leaseRenewInterval": f"{conf.LEASE_RENEW_INTERVAL:g}",
    }

"""Publishing's side of wake-ups: after a message is written, make sure its topic is
announced once the transaction commits, once per topic per transaction.

* PostgreSQL: ``pg_notify`` of the topic in the publishing transaction (the server
  delivers it at commit, once per topic however often it was sent, and drops it with a
  rollback);
* this process's runners (``sqlqueue.wakeups.ring``) and Redis subscribers
  (``WAKEUP_REDIS_URL``): from ``transaction.on_commit``, so nothing wakes before the
  commit and a rollback wakes nothing.

The topics announced by the current transaction are those of our ``on_commit`` callbacks
still pending in it: Django drops the callbacks of a savepoint rolled back (whose
``pg_notify`` the server dropped too), so what remains is exactly what will commit. A
callback is only registered where it has work to do or a statement to save: a ring, a
Redis publish, or a NOTIFY sent as a statement of its own (after a multi-row INSERT). A
NOTIFY carried by the INSERT of ``send_message`` is carried again by the next one.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue import wakeups
from sqlqueue.conf import QueueSettings
from sqlqueue.storage.protocols import PublishStore


class Announcement:
    """The ``on_commit`` callback of one transaction (or savepoint): rings its topics."""

    def __init__(self, redis_url: str) -> None:
        self.topics: set[str] = set()
        self.redis_url = redis_url

    def __call__(self) -> None:
        wakeups.ring(self.topics)
        if self.redis_url:
            from sqlqueue.wakeups.redis_channel import publish

            publish(self.redis_url, sorted(self.topics))


def notification_to_send(connection: BaseDatabaseWrapper, store: PublishStore, topic: str,
                         conf: QueueSettings) -> str | None:
    """The topic whose ``notify_wakeup`` the INSERT of a message about to be written can
    carry (``Store.insert_messages(wake=...)``), if it needs one: one round trip fewer
    than sending it after the INSERT. Then ``announce(..., notified=True)``."""
    if not conf.WAKEUPS or not store.notifies_wakeups or _announced(connection, topic):
        return None
    return topic


def announce(connection: BaseDatabaseWrapper, store: PublishStore, topic: str,
             conf: QueueSettings, *, notified: bool = False) -> None:
    """Wake the consumers of ``topic`` when the message just written on ``connection``
    commits (at once in autocommit). ``notified``: its INSERT sent the ``pg_notify``
    (``notification_to_send``)."""
    if not conf.WAKEUPS:
        return
    rung = bool(conf.WAKEUP_REDIS_URL) or wakeups.subscribed(topic)
    if not rung and (notified or not store.notifies_wakeups):
        # Nobody to ring, and no NOTIFY statement to remember: no commit hook. A NOTIFY
        # the INSERT carried costs nothing to carry again, and the server delivers
        # repeats within a transaction once. A runner subscribing before the commit
        # reads the message on its first pass anyway. Checked before the pending
        # callbacks are searched: the common publish never searches them here.
        return
    if _announced(connection, topic):
        return
    if store.notifies_wakeups and not notified:
        with connection.cursor() as cursor:
            store.notify_wakeup(cursor, topic)
    if connection.in_atomic_block:
        _pending(connection, conf).topics.add(topic)
    elif connection.get_autocommit():
        now = Announcement(conf.WAKEUP_REDIS_URL)
        now.topics.add(topic)
        now()  # committed already
    # else: manual transaction management (set_autocommit(False)) has no commit hook;
    # the NOTIFY (PostgreSQL) still goes at commit, other runners poll.


def _live_savepoints(connection: BaseDatabaseWrapper) -> set[Any]:
    return set(connection.savepoint_ids)


def _callbacks(connection: BaseDatabaseWrapper) -> list[tuple[set[Any], object]]:
    """The pending ``on_commit`` callbacks with the savepoints they were registered in
    (Django keeps ``(savepoint ids, callback, robust)``)."""
    return [(entry[0], entry[1]) for entry in connection.run_on_commit]


def _announced(connection: BaseDatabaseWrapper, topic: str) -> bool:
    """Is ``topic`` announced by a callback that commits whenever this message does (one
    registered in this savepoint or an enclosing one)?"""
    if not connection.in_atomic_block or not connection.run_on_commit:
        return False
    live = _live_savepoints(connection)
    return any(isinstance(callback, Announcement) and topic in callback.topics
               and savepoints <= live for savepoints, callback in _callbacks(connection))


def _pending(connection: BaseDatabaseWrapper, conf: QueueSettings) -> Announcement:
    """This savepoint's announcement, registered with ``on_commit`` on first use."""
    live = _live_savepoints(connection)
    for savepoints, callback in reversed(_callbacks(connection)):
        if isinstance(callback, Announcement) and savepoints == live:
            return callback
    announcement = Announcement(conf.WAKEUP_REDIS_URL)
    # robust: a failing wake-up must not stop the caller's other callbacks.
    connection.on_commit(announcement, robust=True)
    return announcement

"""The admin's pages that show no table of their own (proxies of ``QueueMessage``, no rows
of their own): each names its page and carries the permissions of what is done there."""

from __future__ import annotations

from sqlqueue.models.log import QueueMessage


class ConsumerLag(QueueMessage):
    """The admin's lag dashboard (no rows of its own: it names the page and carries the
    permissions of the repairs made there)."""

    class Meta:
        proxy = True
        verbose_name = "consumer lag"
        verbose_name_plural = "consumer lag"
        permissions = [
            ("retry_now", "Can make backing-off messages deliverable now"),
            ("reset_position", "Can rewind or skip a group's position on a partition"),
        ]


class SubscriberStatus(QueueMessage):
    """The admin's page of live subscribers and their leases (no rows of its own)."""

    class Meta:
        proxy = True
        verbose_name = "subscriber"
        verbose_name_plural = "subscribers and leases"


class LiveOverview(QueueMessage):
    """The admin's live overview page (no rows of its own: the numbers are MinuteStats')."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "live overview"

"""Where one message stands for each consumer group of its topic, for its admin page
(issue 37): every known group is listed, also those that finished it (their delivery
state dropped once the watermark passed it) and those that never started it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlqueue.models import DeliveryState, PartitionOffset, QueueMessage
from sqlqueue.operations.lag import known_subscriptions


@dataclass(frozen=True)
class GroupDelivery:
    group: str
    #: "acked", "retrying", "in flight", "done" (below the group's watermark, its
    #: delivery state collected) or "not started"
    state: str
    attempts: int  # deliveries so far (0: never delivered to this group)
    last_error: str
    #: epoch ms of the next attempt of a retrying message (None otherwise)
    next_attempt_at: int | None


def message_delivery(message: QueueMessage, using: str | None = None) -> list[GroupDelivery]:
    """One row per known group of the message's topic, by group name: a read of its
    delivery states and of the groups' watermarks on its partition (primary keys)."""
    alias = using or message._state.db or "default"
    groups = sorted(g for g, t in known_subscriptions(alias) if t == message.topic)
    where = {"topic": message.topic, "partition_key": message.partition_key}
    states = {s.consumer_group: s for s in DeliveryState.objects.using(alias).filter(
        consumer_group__in=groups, message_offset=message.offset, **where)}
    watermarks = dict(PartitionOffset.objects.using(alias).filter(
        consumer_group__in=groups, **where).values_list("consumer_group", "offset_acked"))
    return [_of_group(group, states.get(group), watermarks.get(group), message.offset)
            for group in groups]


def _of_group(group: str, state: DeliveryState | None, watermark: int | None,
              offset: int) -> GroupDelivery:
    if state is None:
        done = watermark is not None and offset <= watermark
        return GroupDelivery(group, "done" if done else "not started", 0, "", None)
    attempts = state.retry_count + 1  # retry_count counts the deliveries after the first
    if state.acked:
        return GroupDelivery(group, "acked", attempts, state.last_error, None)
    if state.last_error:
        return GroupDelivery(group, "retrying", attempts, state.last_error,
                             state.invisible_until)
    return GroupDelivery(group, "in flight", attempts, "", None)

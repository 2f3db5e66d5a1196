"""Business tables for tests: an order to write next to messages, and a journal of
handler calls that a test (or another process) can read back."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=50, unique=True)

    def __str__(self) -> str:
        return self.reference


class HandlerCall(models.Model):
    """One handler call, written by the consumers in tests/testapp/consumers.py."""

    group = models.CharField(max_length=255)
    topic = models.CharField(max_length=255)
    partition_key = models.CharField(max_length=255)
    message_offset = models.BigIntegerField()
    message_id = models.CharField(max_length=255)
    attempt = models.IntegerField()
    event = models.CharField(max_length=20)  # "started" / "finished"
    pid = models.IntegerField()
    at = models.FloatField()  # time.monotonic() in the handler's process

    def __str__(self) -> str:
        return f"{self.group} {self.topic}@{self.message_offset} #{self.attempt} {self.event}"

"""A business table to write next to messages in the same transaction."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=50, unique=True)

    def __str__(self) -> str:
        return self.reference

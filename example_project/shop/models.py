"""Customers and their orders: the business rows that ``orders.created`` announces."""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.utils import timezone


class Customer(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed", "Placed"
        PAID = "paid", "Paid"
        SHIPPED = "shipped", "Shipped"

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    reference = models.CharField(max_length=32, unique=True)
    total = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return self.reference


class OrderLine(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    sku = models.CharField("SKU", max_length=64)
    quantity = models.PositiveIntegerField()
    unit_price = models.DecimalField(max_digits=10, decimal_places=2)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku}"

    @property
    def subtotal(self) -> Decimal:
        """Quantity times unit price; the order's total is the sum of these."""
        return self.quantity * self.unit_price


class ConfirmationEmail(models.Model):
    """A confirmation "sent" by the ``emails`` consumer: one row per e-mail delivered.

    ``attempt`` is the delivery of ``orders.created`` that finally got through, so the
    demo can show which e-mails needed a retry.
    """

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="confirmation_emails")
    sent_at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField()

    class Meta:
        ordering = ["sent_at", "pk"]

    def __str__(self) -> str:
        return f"Confirmation e-mail for order #{self.order_id} (attempt {self.attempt})"

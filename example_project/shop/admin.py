"""Admin for customers and orders.

Orders are placed through ``services.place_order`` (the form at /orders/ or
``manage.py demo``) so that every order is announced on ``orders.created``; the admin
can inspect and update them but not add them, since an order added here would never
reach the queue.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from example_project.shop.models import ConfirmationEmail, Customer, Order, OrderLine


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ["name", "email"]
    search_fields = ["name", "email"]


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    extra = 0


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["reference", "customer", "total", "status", "created_at"]
    list_filter = ["status", "created_at"]
    list_select_related = ["customer"]
    search_fields = ["reference", "customer__name", "customer__email"]
    date_hierarchy = "created_at"
    inlines = [OrderLineInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """No: an order added here would skip place_order and never be published."""
        return False


@admin.register(ConfirmationEmail)
class ConfirmationEmailAdmin(admin.ModelAdmin):
    list_display = ["order", "attempt", "sent_at"]
    list_filter = ["attempt", "sent_at"]
    list_select_related = ["order"]
    search_fields = ["order__reference"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """No: these record e-mails the ``emails`` consumer sent; see consumers.py."""
        return False

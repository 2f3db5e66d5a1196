"""The order form: GET lists recent orders, POST places one through ``place_order``."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from example_project.shop.models import Customer, Order
from example_project.shop.services import MAX_UNIT_PRICE, LineItem, place_order

RECENT_ORDERS = 20


class OrderForm(forms.Form):
    """A one-line order; enough to show an order and its message being committed."""

    customer = forms.ModelChoiceField(queryset=Customer.objects.all())
    sku = forms.CharField(label="SKU", max_length=64)
    quantity = forms.IntegerField(min_value=1, initial=1)
    unit_price = forms.DecimalField(
        min_value=Decimal("0"), max_value=MAX_UNIT_PRICE, max_digits=10, decimal_places=2
    )


@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """Show the form and recent orders; on a valid POST, place the order and redirect."""
    form = OrderForm(request.POST) if request.method == "POST" else OrderForm()
    if form.is_bound and form.is_valid():
        line = LineItem(
            sku=form.cleaned_data["sku"],
            quantity=form.cleaned_data["quantity"],
            unit_price=form.cleaned_data["unit_price"],
        )
        try:
            order = place_order(form.cleaned_data["customer"], [line])
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Order {order.reference} placed; 'orders.created' was published in the "
                "same transaction.",
            )
            # Post/Redirect/Get: reloading the page must not place the order twice.
            return redirect("orders")
    recent = (
        Order.objects.select_related("customer")
        .prefetch_related("lines")
        .order_by("-created_at", "-pk")[:RECENT_ORDERS]
    )
    status = 400 if form.errors else 200
    return render(
        request,
        "shop/orders.html",
        {
            "form": form,
            "orders": recent,
            "has_customers": Customer.objects.exists(),
        },
        status=status,
    )

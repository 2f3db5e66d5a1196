"""A tiny shop whose orders are announced on the ``orders.created`` topic."""

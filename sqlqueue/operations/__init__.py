"""Operator actions shared by the admin, the management commands and the runtime.

Each function validates its input, does its work in one transaction, and returns what it
did; none of them print.
"""

#: The most rows any one count of the operator's reads (a list page's total, a lag
#: count, a topic's unconsumed messages): a page or a command stays fast whatever is
#: stored, and shows more as "more than" / "at least" this.
COUNT_CAP = 10_000

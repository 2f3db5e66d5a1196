"""Operator actions shared by the admin, the management commands and the runtime.

Each function validates its input, does its work in one transaction, and returns what it
did; none of them print.
"""

"""The engine without a database: an in-memory Django database backend (``memory``) and
the harness that steps runners on it with a manual clock (docs/internals.md, "The engine
without a database")."""

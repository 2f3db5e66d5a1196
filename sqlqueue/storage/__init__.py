"""Storage: the models' tables and the hand-written SQL that runs against them.

``sqlqueue.storage.statements`` builds every statement, named, once and without Django
(tests/integration/test_statement_layer.py runs each on every database);
``sqlqueue.storage.sql`` runs them on a Django connection, one module per database vendor
(tests/integration/test_sql_statements.py, with the EXPLAIN checks). ``retry`` and
``chunks``: the deadlock-victim retry loop and the statement chunker publishing and the
Spark writer share.
"""

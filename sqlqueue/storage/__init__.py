"""Storage: the models' tables and the hand-written SQL that runs against them.

``sqlqueue.storage.sql`` holds one module per database vendor; every statement that
the ORM cannot express (conditional upserts, database-clock arithmetic, index-fitted
reads) is named there and covered by tests/integration/test_sql_statements.py.
"""

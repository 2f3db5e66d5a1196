"""A Django database backend whose database is a Python object (``ENGINE:
"tests.engine.memory"``): its cursor runs no SQL; the queue's named statements run on
``MemoryStore`` instead (``sqlqueue.storage.store`` returns it for these connections).
Commit, rollback and savepoints keep or restore copies of the tables."""

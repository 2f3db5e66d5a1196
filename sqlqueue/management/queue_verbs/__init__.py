"""The verbs of ``manage.py queue`` (sqlqueue.management.commands.queue), one module per
subject: ``arguments`` (the command line), ``status`` (status and health),
``dead_letters``, ``repairs`` (retry-now, reset-position, retire-group, cancel, gc),
``pauses`` (pause, resume, pauses), ``schedules`` and ``archive``.

Each verb is a function of the command's output and its parsed options; the work itself is
done by ``sqlqueue.operations``. Django finds commands only in ``management/commands``, so
nothing here is a command of its own.
"""

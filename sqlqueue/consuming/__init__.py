"""Consuming: ``@consumer`` handlers, the per-partition delivery loop and ``runconsumer``.

Layout: ``registry`` (the decorator and autodiscovery), ``message`` (what handlers get and
raise), ``partition`` (in-memory bookkeeping of one partition, no I/O), ``subscriber``
(the SQL a (group, topic) subscription runs), ``handlers`` (running one handler call),
``runner`` (the process loop behind ``manage.py runconsumer``).
"""

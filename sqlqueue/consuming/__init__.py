"""Consuming: ``@consumer`` handlers, the per-partition delivery loop and ``runconsumer``.

Layout: ``registry`` (the decorator and autodiscovery), ``message`` (what handlers get and
raise), ``partition`` (in-memory bookkeeping of one partition, no I/O), ``subscriber``
(a (group, topic) subscription, with ``delivering`` and ``watermarks``), ``recording``
(what to write for outcomes, no I/O), ``outcomes`` (the one writer of acks and
give-backs), ``handlers`` (running one handler call), ``runner`` (the process loop behind
``manage.py runconsumer``, with ``handoff``, ``pacing`` and ``server``), ``clock``.
"""

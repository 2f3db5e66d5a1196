"""Many seeds of the stepped engine's history test at once, for a sweep after a change to
the engine (the test itself takes 20 fresh seeds a run)::

    .venv/bin/python -m tests.engine.sweep 100000 2000    # seeds 100000-101999

Prints each seed whose history breaks an invariant, with the checker's report, and a
count at the end; exits 1 if any did.
"""

from __future__ import annotations

import logging
import os
import sys


def main(first: int, count: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    # The handlers' failures are the workload's; the lease events (sqlqueue.leases, DEBUG)
    # are recorded all the same (``logging.disable`` would stop them too).
    logging.getLogger("sqlqueue").setLevel(logging.CRITICAL + 1)
    from tests.history.checker import report
    from tests.unit.test_engine_history import run_seed

    broken = 0
    for seed in range(first, first + count):
        history, violations = run_seed(seed)
        if violations:
            broken += 1
            print(f"seed {seed}: {report(history, violations)}", flush=True)
    print(f"{count} seeds from {first}: {broken} with violations")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))

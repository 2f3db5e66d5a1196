"""A module inside an installed app (tests.testapp) that defines no task, with an
import-time effect a test can see: a task path naming it must be refused without
importing it (issue 36, F3: a message never chooses a module to import)."""

IMPORTED = True


def run() -> str:
    return "ran"

"""A module outside every installed app, with an import-time effect a test can see: a
task path naming it must be refused without importing it (issue 14, F3)."""

IMPORTED = True


def run() -> str:
    return "ran"

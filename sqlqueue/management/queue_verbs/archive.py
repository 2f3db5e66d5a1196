"""``queue archive DIR | --forget``: finished messages exported to Parquet before garbage
collection (sqlqueue.integrations.spark.archive, which needs ``django-sqlqueue[spark]``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, OutputWrapper


def archive_or_forget(out: OutputWrapper, options: dict[str, Any]) -> None:
    """Archive ``options["directory"]``, or forget the archive's positions."""
    try:
        from sqlqueue.integrations.spark import archive as spark_archive
    except ImportError as exc:
        raise CommandError(f"The archive needs pyarrow: pip install 'django-sqlqueue[spark]' "
                           f"({exc}).") from None
    if options["forget"]:
        deleted = spark_archive.forget()
        out.write(f"Forgot the archive's position on {deleted} partition(s); "
                  "garbage collection no longer waits for it.")
        return
    if not options["directory"]:
        raise CommandError("Give the archive directory (or --forget).")
    if options["batch_rows"] < 1:
        raise CommandError("--batch-rows must be at least 1.")
    try:
        result = spark_archive.archive(options["directory"], topics=options["topic"],
                                       batch_rows=options["batch_rows"],
                                       on_progress=lambda text: out.write(f"  {text}"))
    except spark_archive.ArchiveError as exc:
        raise CommandError(str(exc)) from None
    out.write(result.describe())
    if result.failed:
        raise CommandError("Not archived (the other topics were): " + "; ".join(
            f"{topic[:80]!r}: {why}" for topic, why in sorted(result.failed.items())))

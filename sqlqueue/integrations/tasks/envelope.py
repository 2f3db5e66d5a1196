"""The payload of a task's message: which task, with which arguments.

``{"task": "shop.tasks.send_receipt", "args": [42], "kwargs": {"copy": true}}``: plain
JSON, readable in the admin's message log and dead letters, and enough for a worker to
run the task even when its result row is gone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlqueue.conf import MAX_NAME_BYTES
from sqlqueue.exceptions import SqlqueueError
from sqlqueue.publishing.messages import MAX_NESTING


class BadEnvelope(SqlqueueError, ValueError):
    """A message on a task topic that does not describe a task."""


@dataclass(frozen=True)
class Envelope:
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        return {"task": self.task_path, "args": self.args, "kwargs": self.kwargs}


def seal(task_path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Envelope:
    """Check that the call is plain JSON before anything is written.

    Strict JSON, not Django's encoder: a datetime or Decimal would reach the task as a
    string, so it is refused here rather than silently changed (Django's rule for task
    arguments).
    """
    if len(task_path.encode("utf-8")) > MAX_NAME_BYTES:
        raise ValueError(f"The task path {task_path[:60]!r}... is longer than "
                         f"{MAX_NAME_BYTES} bytes.")
    envelope = Envelope(task_path, list(args), dict(kwargs))
    try:
        json.dumps(envelope.payload(), allow_nan=False)
    except RecursionError:
        raise TypeError(f"Arguments of {task_path} are nested too deeply (the limit is "
                        f"{MAX_NESTING} levels).") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Arguments of {task_path} must be JSON (str, int, float, bool, None, lists and "
            f"dicts with str keys): {exc}"
        ) from exc
    return envelope


def open_envelope(payload: Any) -> Envelope:
    if not isinstance(payload, Mapping):
        raise BadEnvelope(f"A task message's payload is a JSON object; got {payload!r:.100}.")
    task_path, args, kwargs = payload.get("task"), payload.get("args", []), payload.get(
        "kwargs", {})
    if not isinstance(task_path, str) or not task_path:
        raise BadEnvelope("A task message's payload has no 'task' path.")
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        raise BadEnvelope(f"{task_path}: 'args' must be a list and 'kwargs' an object.")
    return Envelope(task_path, args, dict(kwargs))

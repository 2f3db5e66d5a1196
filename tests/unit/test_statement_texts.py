"""The delivery statements a runner sends every pass build their text once per vendor
(and the fetch once per number of partitions): the same text as built afresh, for every
vendor, and the same object on the next call. No database: the builders alone."""

from __future__ import annotations

import pytest

from sqlqueue.storage.statements import statements_for
from sqlqueue.storage.statements.delivery import OutcomeWrite

pytestmark = pytest.mark.unit

VENDORS = ("mysql", "postgresql", "sqlite")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fetch_of_n_partitions_has_n_members_and_is_built_once(vendor: str) -> None:
    statements = statements_for(vendor)
    texts: dict[int, str] = {}
    for n in (1, 2, 3, 8):
        sql, params = statements.fetch_partitions(
            "g", "t", [(f"p{k}", 10 * k) for k in range(n)], 5)
        assert sql.count(" UNION ALL ") == n - 1
        assert len(params) == 6 * n
        assert params[:6] == ["g", 0, "t", "p0", 0, 5]
        texts[n] = sql
    again, _ = statements.fetch_partitions("g", "u", [("a", 1), ("b", 2)], 7)
    assert again is texts[2]  # the kept text, whatever the group, topic or limit
    fresh = type(statements)()  # nothing kept yet: every text built afresh
    assert fresh.fetch_partitions("g", "t", [("p0", 0), ("p1", 10), ("p2", 20)], 5)[0] \
        == texts[3]


@pytest.mark.parametrize("vendor", VENDORS)
def test_marks_and_outcomes_keep_their_text_and_take_new_values(vendor: str) -> None:
    statements = statements_for(vendor)
    first, first_params = statements.mark_delivered("g", "t", [("p", 1, 100)])
    second, second_params = statements.mark_delivered("g", "t", [("p", 2, 200)])
    assert first_params != second_params
    write = [OutcomeWrite("p", 1, True, 0), OutcomeWrite("q", 2, False, 5, "boom")]
    outcome, values = statements.write_outcomes("g", "t", write)
    assert statements.write_outcomes("g", "t", write) == (outcome, values)
    fresh = type(statements)()
    assert fresh.mark_delivered("g", "t", [("p", 1, 100)])[0] == first
    assert fresh.write_outcomes("g", "t", write)[0] == outcome
    if vendor == "postgresql":  # one text for any number of rows (arrays of values)
        assert first is second
        assert values[:2] == ["g", "t"] and values[2] == '{"p","q"}'
    else:
        assert first == second  # one row each: the same VALUES list
        assert "boom" in values

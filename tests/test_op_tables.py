"""Every tile op has its entry in each per-op table: lowering, hazard rules, verification
and printing. Adding an op (docs/architecture.md, "How to add an op") means one class in
ir/tile.py and one entry in each table; a missing entry fails here, not in a user's kernel."""
import pytest

from tilegen.ir import tile
from tilegen.ir.hazards import RULES
from tilegen.ir.lower import LOWERINGS
from tilegen.ir.printer import TEXT
from tilegen.ir.verify import CHECKS

TABLES = {"lowering (ir/lower)": LOWERINGS, "hazard rules (ir/hazards.py)": RULES,
          "verification (ir/verify.py)": CHECKS, "printing (ir/printer.py)": TEXT}


def _ops():
    seen, todo = [], [tile.TileOp]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            seen.append(sub)
            todo.append(sub)
    return sorted(seen, key=lambda c: c.__name__)


def test_there_are_ops():
    assert len(_ops()) >= 18


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_op_has_an_entry(table):
    missing = [op.__name__ for op in _ops() if op not in TABLES[table]]
    assert not missing, f"{table} has no entry for {', '.join(missing)}"
    extra = [k for k in TABLES[table] if not (isinstance(k, type) and issubclass(k, tile.TileOp))]
    assert not extra, f"{table} has entries for non-ops: {extra}"

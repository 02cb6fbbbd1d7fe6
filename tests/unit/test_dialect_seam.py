"""One seam for the SQL side: only the stores (durable_tasks/store/, where the engine is built
and the store chosen) and the migrations' per-backend classes ask which database they run on.
Every other module calls the Store protocol, or a backend chosen once, and never branches on a
dialect name."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "durable_tasks"
#: Where a dialect test belongs: the store implementations with the engine factory, and the
#: migration backends (chosen once by backend_for).
ALLOWED = ("store/", "migrations/backends.py")
NAMES = r"(?:postgresql|postgres|sqlite|mysql|mariadb)"
DIALECT_TESTS = re.compile(
    r"\bis_(?:postgres|sqlite|mysql)\b"
    r"|(?:dialect\.name|dialect\.driver|get_backend_name\(\)|drivername)\s*(?:==|!=|\bin\b|\bnot\s+in\b)"
    rf"|(?:==|!=)\s*[\"']{NAMES}[\"']"
    rf"|\bin\s*[(\[{{]\s*[\"']{NAMES}[\"']"
    rf"|\.startswith\(\s*[\"']{NAMES}"
)


def dialect_tests(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if DIALECT_TESTS.search(line)]


def test_the_pattern_finds_each_kind_of_dialect_test() -> None:
    found = dialect_tests(
        'if self.is_postgres:\nif engine.dialect.name == "sqlite":\nif url.get_backend_name() in ("mysql",):\n'
        'x = name != "postgresql"\nif url.startswith("sqlite"):\nkind in ["mariadb"]\n'
    )
    assert len(found) == 6
    assert dialect_tests('conn.exec_driver_sql("SELECT 1")\nname = missing["mysql"]\n') == []


def test_no_module_outside_the_stores_asks_which_database_it_runs_on() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if not str(path.relative_to(PACKAGE)).startswith(ALLOWED)
        and (found := dialect_tests(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "move these behind the Store protocol (or a migrations backend)"

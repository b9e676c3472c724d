"""Dependencies run one way: switchboard's wiring and console → admission → queues →
switchboard.core and switchboard.ledger. A new import against that direction (at module level,
inside a function or under TYPE_CHECKING alike) fails here, with the offending line named."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from queues.models import Attempt, Todo

BASE_DIR = Path(__file__).resolve().parent.parent


def test_every_import_contract_is_kept() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_the_contract_names_the_layers_in_order() -> None:
    config = tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    assert layers[-3:] == ["admission", "queues", "switchboard.core | switchboard.ledger"]
    assert "switchboard.console" in layers[1]


# The work tables: the todos and their attempts. Every statement naming them lives under
# queues/sql/ (the claim, the transitions, the sweeps, the push path's reads, the fleet's reads and
# the fragments admission's gates compose); the rest of the code asks those modules or the ORM.
SQL_HOME = BASE_DIR / "queues" / "sql"
APP_PACKAGES = ("admission", "queues", "switchboard")


def work_tables() -> list[str]:
    return [Todo._meta.db_table, Attempt._meta.db_table]


def work_table_sql_outside_its_home(root: Path) -> list[str]:
    """``path:line`` of each line of the apps' Python (migrations aside) outside queues/sql/
    that names a work table."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, work_tables())) + r")\b")
    found = []
    for package in APP_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if "migrations" in relative.parts or relative.parts[:2] == ("queues", "sql"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_every_statement_on_the_work_tables_lives_in_queues_sql() -> None:
    assert SQL_HOME.is_dir()
    assert work_table_sql_outside_its_home(BASE_DIR) == []


def test_the_sql_home_check_finds_a_statement_written_elsewhere(tmp_path: Path) -> None:
    stray = tmp_path / "admission" / "limits" / "stray.py"
    stray.parent.mkdir(parents=True)
    stray.write_text('COUNT = "SELECT count(*) FROM queues_attempt a WHERE a.ended_at IS NULL"\n')
    (tmp_path / "queues" / "sql").mkdir(parents=True)
    (tmp_path / "queues" / "sql" / "home.py").write_text('Q = "SELECT 1 FROM queues_todo"\n')
    (tmp_path / "queues" / "migrations").mkdir()
    (tmp_path / "queues" / "migrations" / "0001.py").write_text('Q = "ALTER TABLE queues_todo"\n')
    assert work_table_sql_outside_its_home(tmp_path) == [
        'admission/limits/stray.py:1: COUNT = "SELECT count(*) FROM queues_attempt a WHERE'
        ' a.ended_at IS NULL"'
    ]

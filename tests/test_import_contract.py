"""Dependencies run one way: switchboard's wiring and console → admission → queues →
switchboard.core and switchboard.ledger. A new import against that direction (at module level,
inside a function or under TYPE_CHECKING alike) fails here, with the offending line named."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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

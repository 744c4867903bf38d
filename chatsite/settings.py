"""Settings for the chat server, read from the environment (see .env.example)."""

import os
import secrets
import time
import zoneinfo
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from chatsite import mailconfig

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    """The variable's value; unset or empty, the default (.env.example lists most as `NAME=`)."""
    return os.environ.get(name) or default


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


def env_number(name: str, default, kind=int):
    """A number from the environment: none of them means anything below 0 (POSITIVE, below, not even 0)."""
    value = env(name)
    try:
        number = kind(value) if value else default
    except (ValueError, InvalidOperation):
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from None
    if isinstance(number, Decimal) and not number.is_finite():
        return number  # NaN cannot be compared; its setting's own check below names it
    if number is not None and number < 0:
        raise ImproperlyConfigured(f"{name} must be 0 or more, not {value}")
    return number


DEBUG = env_bool("DJANGO_DEBUG", False)
# Behind TLS (directly or via a proxy): secure cookies, HSTS and the https redirect.
HTTPS = env_bool("DJANGO_HTTPS", False)


def _secret_key() -> str:
    """The key from the environment, else one generated once and kept beside the code."""
    key = env("DJANGO_SECRET_KEY")
    if key:
        return key
    path = BASE_DIR / ".secret_key"
    try:
        # Created with mode 600 in one step: no moment when another user could read it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass  # made earlier, or just now by another process starting beside this one
    else:
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(50))
    for _ in range(100):
        key = path.read_text().strip()
        if key:
            return key
        time.sleep(0.02)  # another process created it a moment ago and is still writing it
    raise ImproperlyConfigured(f"{path} is empty: delete it and a new key is generated")


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
# Under /api/ a JSON error the page can show; elsewhere Django's page.
CSRF_FAILURE_VIEW = "chat.views.json_api.csrf_failure"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "chat",
]

# Most of Django's own subclassed in chatsite/middleware.py to run on the event loop (no thread
# hand-off per hook), and WhiteNoise made async-capable there. Security, CSRF and X-Frame-Options
# keep Django's names: `check --deploy` looks for them.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "chatsite.middleware.ContentSecurityPolicyMiddleware",
    "chatsite.middleware.NoStoreMiddleware",
    "chatsite.middleware.StaticFilesMiddleware",
    "chatsite.middleware.SessionMiddleware",
    # After sessions, before common (which may redirect): picks the language from the cookie or Accept-Language.
    "chatsite.middleware.LocaleMiddleware",
    "chatsite.middleware.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "chatsite.middleware.AuthenticationMiddleware",
    "chatsite.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Near the end, so it sees a view's exception early: a busy database answers 503, not 500.
    "chat.runtime.db_busy.DatabaseBusyMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

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
                "chat.auth.invites.sign_in_options",
            ],
        },
    },
]

# SQLite by default: WAL lets readers run beside the writer, IMMEDIATE takes the
# write lock at BEGIN so two writers queue on the busy timeout instead of failing (OPTIONS below).
DATABASES = {
    "default": dj_database_url.parse(env("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"), conn_max_age=0)
}
# PostgreSQL: a pool of connections per process, when DATABASE_POOL_SIZE is set. Opening a
# connection costs a few ms (a new backend with cold caches), which every stream start and every
# websocket message pays without it. Django's persistent connections (CONN_MAX_AGE) are no answer
# under ASGI: a connection belongs to one request's or one socket's context, so /v1 requests would
# leak one each and every open socket would hold one. Pooled, a connection
# goes back to the pool when Django closes it (after each request and each of Channels' database
# calls) and is checked before reuse. Off by default: through a database outage the pool waits
# for a connection where a fresh connect fails at once, which changes how partial saves and
# leases behave mid-outage (tests/cluster/test_scaleout.py's outage test expects a fresh connect to fail at once).
DATABASE_POOL_SIZE = env_number("DATABASE_POOL_SIZE", 0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and DATABASE_POOL_SIZE:
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # for a pool: each connection checked when taken
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": DATABASE_POOL_SIZE,
        # A request that finds every connection busy waits this long, then fails (503 database_unavailable).
        "timeout": 5,
        # After an outage, a new connection is tried at least every 2 s (the pool's own backoff
        # grows to minutes, so a process stayed without its database, and its lease, long after).
        "reconnect_timeout": 2,
    }
# PostgreSQL: each statement's values sent apart from its text (server-side binding), and a statement a connection
# has run five times kept prepared on it. Every stream start runs the same dozen statements; written with their
# values in, the database parsed and planned each again, which cost it more CPU than running them. Off
# (DATABASE_PREPARED=0) behind a pooler that cannot keep prepared statements (PgBouncer before 1.21, or in
# transaction mode without max_prepared_statements).
DATABASE_PREPARED = env_bool("DATABASE_PREPARED", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and DATABASE_PREPARED:
    DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": True, "prepare_threshold": 5})
# The threads that do a stream's database work, each keeping one connection (chat/runtime/db_threads.py). SQLite
# takes one writer at a time: one thread queues them in order instead of polling for the lock.
DATABASE_THREADS = env_number(
    "DATABASE_THREADS", 1 if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" else 4
)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": " ".join(
            [
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                # A usage row's write fires the summary triggers (chat/metering/summary_triggers.py): their journal
                # outgrew SQLite's 64 KiB and went to a new file in /var/tmp on every stream's final
                # save (create, write, unlink: system calls on the hot path).
                "PRAGMA temp_store=MEMORY;",
                # The serving process copies the write-ahead log into the database file every second
                # (chat/runtime/process_loops.py); a commit does it itself only past this many pages (SQLite's: 1,000).
                "PRAGMA wal_autocheckpoint=10000;",
            ]
        ),
    }
    # Django's backend, with each statement's placeholders rewritten once per process (chatsite/sqlite3).
    DATABASES["default"]["ENGINE"] = "chatsite.sqlite3"

REDIS_URL = env("REDIS_URL")
# Every key this install writes in Redis starts with this, so installs (and test runs) can share a server.
REDIS_PREFIX = env("REDIS_PREFIX", "chat")
# Group memberships of a crashed process expire after this; live ones are renewed (chat/runtime/channel_layers.py).
REDIS_GROUP_EXPIRY = env_number("REDIS_GROUP_EXPIRY", 300)
if REDIS_URL:
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.runtime.channel_layers.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # redis-py 8 defaults to a 5 s socket timeout, the same as channels-redis's
                        # blocking BZPOPMIN: an idle read then timed out. Reads may block 5 s, so 15.
                        "socket_timeout": 15,
                        "socket_connect_timeout": 5,
                        "socket_keepalive": True,
                        # a connection idle this long is PINGed before use, so a dead one is replaced
                        "health_check_interval": 10,
                        # ...and a broken one (Redis restarted) is reconnected instead of failing a socket
                        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                    }
                ],
                "prefix": REDIS_PREFIX,
                "capacity": 1000,
                "expiry": 60,
                "group_expiry": REDIS_GROUP_EXPIRY,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.runtime.channel_layers.LocalChannelLayer",
            "CONFIG": {"capacity": 1000, "expiry": 60},
        }
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Axes refuses locked-out sign-ins before any password is hashed; ours bounds the hashing.
AUTHENTICATION_BACKENDS = ["chat.auth.signin.LockoutBackend", "chat.auth.signin.BoundedModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
# The browser's Accept-Language picks one of these unless the settings page's switch set a cookie.
LANGUAGES = [("en", "English"), ("fr", "Français")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env("DJANGO_TIME_ZONE", "UTC")
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(f"DJANGO_TIME_ZONE must be a zone such as Europe/Paris, not {TIME_ZONE!r}") from None
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise's own table (not the system's), made explicit for the types a browser is strict about (an ES
# module must come as JavaScript) and the fonts; deploy/nginx/chat.conf serves the same types.
WHITENOISE_MIMETYPES = {
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".ttf": "font/ttf",
    ".woff": "font/woff",
    ".map": "application/json",
}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "chatsite.storage.StaticFilesStorage"
    },
}

# --- Attachments (chat/lib/attachment_content.py, chat/models/attachments.py) -------------------
# Where their bytes are kept: "database" (the default with SQLite), "files" (a directory under
# MEDIA_ROOT, the default otherwise) or "s3" (S3-compatible, django-storages; its AWS_* settings below).
ATTACHMENT_STORAGE = env(
    "ATTACHMENT_STORAGE", "database" if DATABASES["default"]["ENGINE"].endswith("sqlite3") else "files"
)
MEDIA_ROOT = Path(env("MEDIA_ROOT", str(BASE_DIR / "media")))
if ATTACHMENT_STORAGE == "s3":
    STORAGES["attachments"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            # Credentials come from boto3's usual places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, a role).
            "bucket_name": env("AWS_STORAGE_BUCKET_NAME"),
            "endpoint_url": env("AWS_S3_ENDPOINT_URL") or None,
            "region_name": env("AWS_S3_REGION_NAME") or None,
            "location": env("AWS_LOCATION", "attachments"),
            "default_acl": "private",
            "file_overwrite": False,
            "querystring_auth": True,
        },
    }
elif ATTACHMENT_STORAGE in ("files", "database"):
    # Never served by URL: the app reads it and answers as a download (chat/views/conversations.py).
    STORAGES["attachments"] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": MEDIA_ROOT / "attachments", "base_url": None},
    }
else:
    raise ImproperlyConfigured("ATTACHMENT_STORAGE must be database, files or s3")
# Per file and per message (bytes uploaded), the estimated tokens of a message with its documents,
# each owner's storage (bytes kept), and how long reading one file may take.
ATTACHMENT_MAX_FILE_BYTES = env_number("ATTACHMENT_MAX_FILE_BYTES", 20_000_000)
ATTACHMENT_MAX_MESSAGE_BYTES = env_number("ATTACHMENT_MAX_MESSAGE_BYTES", 50_000_000)
ATTACHMENT_MAX_MESSAGE_TOKENS = env_number("ATTACHMENT_MAX_MESSAGE_TOKENS", 100_000)
ATTACHMENT_QUOTA_BYTES = env_number("ATTACHMENT_QUOTA_BYTES", 1_000_000_000)
ATTACHMENT_EXTRACT_SECONDS = env_number("ATTACHMENT_EXTRACT_SECONDS", 20.0, float)
# Uploads one person may have in flight at once on a process (parsed, waiting to be read, read); more: 429.
ATTACHMENT_MAX_UPLOADS_IN_FLIGHT = env_number("ATTACHMENT_MAX_UPLOADS_IN_FLIGHT", 4)
# Uploads (and the body an upload arrives in) are spooled to a temporary file past this, never held
# whole in memory while they wait; a file is read into memory only when its turn to be read comes.
FILE_UPLOAD_MAX_MEMORY_SIZE = 262_144
FILE_UPLOAD_HANDLERS = [
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# The page's scripts take the CSRF token from the page (chat/views/conversations.py), never from the cookie.
CSRF_COOKIE_HTTPONLY = True
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_number("DJANGO_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)

# One line per event, with the request's id (chatsite/logs.py); LOG_FORMAT=json: one JSON object a line.
LOG_FORMAT = env("LOG_FORMAT", "plain")
LOG_LEVEL = env("LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {LOG_LEVEL!r}")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured("LOG_FORMAT must be plain or json")
# The access log (chatsite/server.py: one line per request and websocket, probes left out): on by default.
LOG_ACCESS = env_bool("LOG_ACCESS", True)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "chatsite.logs.RequestIdFilter"},
        "secret_paths": {"()": "chatsite.logs.SecretPathFilter"},
        "suspicious_requests": {"()": "chatsite.logs.SuspiciousRequestFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"},
        "json": {"()": "chatsite.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_id", "secret_paths", "suspicious_requests"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # httpx logs every request line at INFO; only our own summaries are wanted. So does httpx2, the MCP
    # SDK's client, with a tool server's URL (which may carry a key); the SDK logs a server's session
    # id at INFO, which lets whoever reads the log act in that session.
    # django-axes logs every sign-in at INFO; lockouts are WARNING.
    # django.request: an error answer is logged by whoever made it (chat/runtime/db_busy.py, /v1's upstream
    # errors), once; Django's own "Internal Server Error" line stays for real bugs (ERROR, with the traceback).
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "mcp": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
        "chatsite.access": {"level": "INFO" if LOG_ACCESS else "WARNING"},
    },
}

# --- The chat itself -------------------------------------------------------
# The default upstream; unset means the built-in demo upstream (fakeupstream/app.py).
UPSTREAM_BASE_URL = env("UPSTREAM_BASE_URL")
UPSTREAM_API_KEY = env("UPSTREAM_API_KEY")
UPSTREAM_MODEL = env("UPSTREAM_MODEL")
UPSTREAM_NAME = env("UPSTREAM_NAME", "default")
# Where this server itself listens, so the demo provider can reach /_demo/.
PUBLIC_PORT = env_number("PORT", 8000)
DEMO_UPSTREAM = env_bool("DEMO_UPSTREAM", not UPSTREAM_BASE_URL)

UPSTREAM_MAX_TOKENS = env_number("UPSTREAM_MAX_TOKENS", 8192)
UPSTREAM_CONNECT_TIMEOUT = env_number("UPSTREAM_CONNECT_TIMEOUT", 10.0, float)
UPSTREAM_READ_TIMEOUT = env_number("UPSTREAM_READ_TIMEOUT", 300.0, float)
# From sending a streaming request to the first byte of its answer: a dead upstream is noticed sooner.
UPSTREAM_FIRST_BYTE_TIMEOUT = env_number("UPSTREAM_FIRST_BYTE_TIMEOUT", 60.0, float)
UPSTREAM_DEADLINE = env_number("UPSTREAM_DEADLINE", 1800.0, float)
UPSTREAM_MAX_CONNECTIONS = env_number("UPSTREAM_MAX_CONNECTIONS", 1000)
UPSTREAM_MODELS_CACHE_SECONDS = env_number("UPSTREAM_MODELS_CACHE_SECONDS", 300)
# What an upstream may send: one SSE line (event), bytes; unreadable events skipped before
# a stream fails; a whole non-stream /v1 response, bytes.
UPSTREAM_MAX_LINE_BYTES = env_number("UPSTREAM_MAX_LINE_BYTES", 1_000_000)
UPSTREAM_MAX_MALFORMED = env_number("UPSTREAM_MAX_MALFORMED", 3)
API_MAX_RESPONSE_BYTES = env_number("API_MAX_RESPONSE_BYTES", 10_000_000)
# A reply (text + reasoning, UTF-8 bytes) past this is stopped and marked failed, its text kept.
CHAT_MAX_REPLY_BYTES = env_number("CHAT_MAX_REPLY_BYTES", 2_000_000)
# Link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254) hand out
# the machine's cloud credentials: providers there are refused, when saved and when called.
UPSTREAM_ALLOW_LINK_LOCAL = env_bool("UPSTREAM_ALLOW_LINK_LOCAL", False)

CHAT_MAX_CONTENT_BYTES = env_number("CHAT_MAX_CONTENT_BYTES", 100_000)
# Deltas are coalesced for this long before one channel-layer message carries them.
CHAT_COALESCE_MS = env_number("CHAT_COALESCE_MS", 30)
CHAT_SAVE_INTERVAL = env_number("CHAT_SAVE_INTERVAL", 1.0, float)
# Every serving process renews a lease row every CHAT_LEASE_SECONDS / 4; a process whose
# lease is older than this is dead, and the others mark its streams interrupted.
CHAT_LEASE_SECONDS = env_number("CHAT_LEASE_SECONDS", 6.0, float)
# How often each process checks that the people connected to it are still active accounts
# (deactivated by a command in another process, or in bulk: signed out here within this).
CHAT_ACCOUNT_CHECK_SECONDS = env_number("CHAT_ACCOUNT_CHECK_SECONDS", 1.0, float)
# Tools in the chat (docs/tools.md): MCP servers' tools the model may call.
# A JSON file of stdio servers (commands run on this host), never set from the admin:
# {"servers": {"name": {"command": "…", "args": […], "env": {…}, "cwd": "…"}}}
MCP_SERVERS_FILE = env("MCP_SERVERS_FILE")
# Rounds of tool calls in one turn; past it the turn ends, saying so.
MCP_MAX_ROUNDS = env_number("MCP_MAX_ROUNDS", 5)
# One call's time limit, and the most characters of its result kept and sent to the model.
MCP_CALL_SECONDS = env_number("MCP_CALL_SECONDS", 30.0, float)
MCP_RESULT_MAX_CHARS = env_number("MCP_RESULT_MAX_CHARS", 20_000)
# Tool calls per person a minute; more are answered to the model as refused.
MCP_CALLS_PER_MINUTE = env_number("MCP_CALLS_PER_MINUTE", 30)
# How often each process lists every server's tools again (their health), and how long a person has to approve.
MCP_REFRESH_SECONDS = env_number("MCP_REFRESH_SECONDS", 300.0, float)
MCP_APPROVAL_SECONDS = env_number("MCP_APPROVAL_SECONDS", 300.0, float)
# Retention: `manage.py purge` deletes conversations untouched for this many days (0: never).
CHAT_RETENTION_DAYS = env_number("CHAT_RETENTION_DAYS", 0)
# Whether owners see who (other than them) read their conversations: a "Reviewed by" line.
CHAT_SHOW_REVIEWS = env_bool("CHAT_SHOW_REVIEWS", False)
# Share links: whether an owner may make one public (anyone with the link); off, they are for signed-in people.
CHAT_PUBLIC_SHARES = env_bool("CHAT_PUBLIC_SHARES", False)
# The largest JSON export accepted by the import (within REQUEST_MAX_BYTES and nginx's client_max_body_size).
CHAT_IMPORT_MAX_BYTES = env_number("CHAT_IMPORT_MAX_BYTES", 2_000_000)
# What one import may hold, checked before anything is stored (more is a 413 that says the limit): conversations, and
# messages in all of them.
CHAT_IMPORT_MAX_CONVERSATIONS = env_number("CHAT_IMPORT_MAX_CONVERSATIONS", 1_000)
CHAT_IMPORT_MAX_MESSAGES = env_number("CHAT_IMPORT_MAX_MESSAGES", 20_000)
# A request that writes many rows (an import, deleting a long conversation) writes at most this many to a
# transaction, each a short hold of the database's write lock with others' starts and requests between them.
CHAT_BATCH_ROWS = env_number("CHAT_BATCH_ROWS", 500)
# The most messages one read of a conversation returns: the chat page gets the last ones of the branch shown and
# asks for earlier ones as it is scrolled up; an export is written to its download this many at a time.
CHAT_PAGE_MESSAGES = env_number("CHAT_PAGE_MESSAGES", 200)
# Titles written by a model after a conversation's first answer (chat/actions/titles.py), metered like any
# stream; the model: CHAT_TITLE_MODEL (a model id or provider/model, used whatever models the person may
# pick), empty: the conversation's own.
CHAT_TITLES = env_bool("CHAT_TITLES", True)
CHAT_TITLE_MODEL = env("CHAT_TITLE_MODEL", "")
# How long a finished answer's final save is retried (with backoff) before giving up.
CHAT_FINAL_SAVE_SECONDS = env_number("CHAT_FINAL_SAVE_SECONDS", 120.0, float)
# The OpenAI-compatible API (/v1/): a comment line this often while the upstream is silent,
# and whether API requests are also kept as conversations (off: only usage is recorded).
API_HEARTBEAT_SECONDS = env_number("API_HEARTBEAT_SECONDS", 15.0, float)
API_STORE_CONVERSATIONS = env_bool("API_STORE_CONVERSATIONS", False)
# The most a /v1/responses conversation (previous_response_id's, back to its first) may hold, in bytes of its
# stored items: a follow-up to a longer one is refused (400) rather than sent upstream whole.
RESPONSES_MAX_HISTORY_BYTES = env_number("RESPONSES_MAX_HISTORY_BYTES", 20_000_000)
# A /v1 stream's tokens so far are written on its usage row this often, seconds: what is kept
# of them if the process dies mid-stream (the text itself is not kept).
API_CHECKPOINT_SECONDS = env_number("API_CHECKPOINT_SECONDS", 5.0, float)
# A /v1 completion's token (with its owner) is kept this long in the process that read it: a
# revocation or deactivation elsewhere reaches that process within it (at once in the same one).
API_TOKEN_CACHE_SECONDS = env_number("API_TOKEN_CACHE_SECONDS", 5.0, float)
# Who may use which model, the enabled providers and each person's chat defaults, read on every stream
# start, are kept this long by each process (chat/runtime/kept_reads.py): a change saved through the
# models reaches every process at once through Redis, and within this when it cannot be told (or when it
# bypassed the models: QuerySet.update(), raw SQL). 0: read on every start.
ACCESS_CACHE_SECONDS = env_number("ACCESS_CACHE_SECONDS", 5.0, float)
# Overload (chat/ws/overload.py): websocket connects beyond this many a second, or while this many
# handshakes are unfinished, are closed with 4013 before any database work (0: no limit);
# a socket's session -> user read is cached this long (a sign-out reaches new sockets after it).
WS_CONNECTS_PER_SECOND = env_number("WS_CONNECTS_PER_SECOND", 200.0, float)
WS_MAX_CONNECTING = env_number("WS_MAX_CONNECTING", 100)
WS_SESSION_CACHE_SECONDS = env_number("WS_SESSION_CACHE_SECONDS", 5.0, float)
# A /v1 request that cannot get the database (SQLite write lock held, PostgreSQL down) is
# answered 503 with this Retry-After; SQLite's write lock is waited for this long first.
API_DB_WAIT_SECONDS = env_number("API_DB_WAIT_SECONDS", 2.0, float)
API_RETRY_AFTER_SECONDS = env_number("API_RETRY_AFTER_SECONDS", 5)
# How long a start waits for PostgreSQL while it answers busy (no connection free, a lock not had in time)
# before it is refused as busy like a database that does not answer (chat/runtime/db_busy.py).
DATABASE_BUSY_WAIT_SECONDS = env_number("DATABASE_BUSY_WAIT_SECONDS", 30.0, float)
# How many connections may wait to be accepted on a port the server opens (-b/-p, -u): a burst's.
# The kernel caps it at net.core.somaxconn. Twisted's own, 50, made a burst's excess wait a second.
LISTEN_BACKLOG = env_number("LISTEN_BACKLOG", 2048, int)
# How long the event loop keeps the interpreter while a database thread waits for it (chatsite/server.py); Python's: 5.
GIL_SWITCH_INTERVAL_MS = env_number("GIL_SWITCH_INTERVAL_MS", 5.0, float)

# --- Limits per person and per token (chat/metering/limits.py); 0 turns a limit off -----
# Streams running at once per user on the page, per user over /v1/, and per API token.
CHAT_MAX_STREAMS = env_number("CHAT_MAX_STREAMS", 4)
API_MAX_STREAMS = env_number("API_MAX_STREAMS", 8)
API_TOKEN_MAX_STREAMS = env_number("API_TOKEN_MAX_STREAMS", API_MAX_STREAMS)
# Streams started in the last minute, per user (page and API together) and per API token.
RATE_LIMIT_PER_MINUTE = env_number("RATE_LIMIT_PER_MINUTE", 60)
API_TOKEN_RATE_LIMIT_PER_MINUTE = env_number("API_TOKEN_RATE_LIMIT_PER_MINUTE", RATE_LIMIT_PER_MINUTE)
# Frames a websocket may send: a token bucket of CHAT_FRAME_BURST refilled at CHAT_FRAME_RATE a second.
CHAT_FRAME_RATE = env_number("CHAT_FRAME_RATE", 20.0, float)
CHAT_FRAME_BURST = env_number("CHAT_FRAME_BURST", 60)
# All of a person's sockets on a process share twice that (so many sockets are no way around it), and a person
# may have this many sockets open on a process (tabs, windows; 0: no limit); one more is closed with 4013.
CHAT_MAX_SOCKETS_PER_PERSON = env_number("CHAT_MAX_SOCKETS_PER_PERSON", 20)
# The largest max_tokens (and max_completion_tokens) accepted on every path, and n on /v1/.
MAX_TOKENS_LIMIT = env_number("MAX_TOKENS_LIMIT", 32768)
API_MAX_N = env_number("API_MAX_N", 1)
# Upstream connections per provider and process when its admin field is empty (default:
# half the shared pool, so a slow provider leaves the other half), and how long a request
# waits for one of them before it fails.
UPSTREAM_PROVIDER_MAX_CONNECTIONS = env_number(
    "UPSTREAM_PROVIDER_MAX_CONNECTIONS", max(1, UPSTREAM_MAX_CONNECTIONS // 2)
)
UPSTREAM_PROVIDER_WAIT = env_number("UPSTREAM_PROVIDER_WAIT", 10.0, float)

# --- Budgets (chat/metering/budgets.py): monthly, per calendar month in TIME_ZONE -------
# Everyone's budget unless a group or user Budget (admin, `manage.py budget`) says otherwise;
# empty: no limit of that kind.
BUDGET_DEFAULT_USD = env_number("BUDGET_DEFAULT_USD", None, Decimal)
BUDGET_DEFAULT_TOKENS = env_number("BUDGET_DEFAULT_TOKENS", None)

# An open socket re-reads its session before a send/regenerate/edit at most this often, seconds.
CHAT_SESSION_CHECK_SECONDS = env_number("CHAT_SESSION_CHECK_SECONDS", 5.0, float)

# --- Sign-in throttling (django-axes) ----------------------------------------
# This many failed sign-ins for one account, or from one address, lock it for AUTH_LOCKOUT_MINUTES
# (counted while failures keep coming less than that far apart); staff unlock in the admin.
AUTH_LOCKOUT_FAILURES = env_number("AUTH_LOCKOUT_FAILURES", 10)
AUTH_LOCKOUT_MINUTES = env_number("AUTH_LOCKOUT_MINUTES", 15)
# Passwords hashed at once (each costs ~0.5 s of a core; the default leaves a core for everything else),
# and how long a sign-in waits for its turn before it is told the server is busy.
AUTH_HASH_CONCURRENCY = env_number("AUTH_HASH_CONCURRENCY", max(1, (os.cpu_count() or 2) - 1))
AUTH_HASH_WAIT = env_number("AUTH_HASH_WAIT", 10.0, float)
# Proxies whose X-Forwarded-For is believed for the client's address (IPs or networks); otherwise
# the address of the TCP peer counts, so a client cannot pick the address it is throttled under.
TRUSTED_PROXIES = env_list("DJANGO_TRUSTED_PROXIES")
AXES_FAILURE_LIMIT = AUTH_LOCKOUT_FAILURES
AXES_COOLOFF_TIME = timedelta(minutes=AUTH_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own, not the pair
AXES_LOCKOUT_CALLABLE = "chat.auth.signin.lockout_response"
AXES_CLIENT_IP_CALLABLE = "chat.auth.signin.client_ip"
# Failures count per account, whichever spelling of its username or e-mail address is typed.
AXES_USERNAME_CALLABLE = "chat.auth.signin.lockout_username"
AXES_VERBOSE = False

if CHAT_LEASE_SECONDS < 2:
    raise ImproperlyConfigured("CHAT_LEASE_SECONDS must be at least 2")
# --- The server (chatsite/server.py) ----------------------------------------
# Largest request body, bytes (Django's own limit too): larger ones get 413 as they arrive.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_number("REQUEST_MAX_BYTES", 2_621_440)
# A /v1 chat completion's or response's body: room for an image of ATTACHMENT_MAX_FILE_BYTES as a data: URL
# (base64 makes 20 MB 26.7 MB) besides the text. 28 MiB, nginx's `client_max_body_size 28m`.
API_MAX_BODY_BYTES = env_number("API_MAX_BODY_BYTES", 29_360_128)
# A /v1 stream's client that reads nothing for this long is disconnected (its usage is kept);
# a websocket that does not take its frames for this long is closed with 4008.
API_SLOW_CLIENT_SECONDS = env_number("API_SLOW_CLIENT_SECONDS", 30.0, float)
CHAT_SLOW_CLIENT_SECONDS = env_number("CHAT_SLOW_CLIENT_SECONDS", 30.0, float)
# On SIGTERM: no new connections, running streams get this long to finish, then are interrupted.
SHUTDOWN_GRACE_SECONDS = env_number("SHUTDOWN_GRACE_SECONDS", 20.0, float)
# GET /metrics (docs/operations.md#metrics) answers only to `Authorization: Bearer <METRICS_TOKEN>`; unset: 404.
# Several processes on one machine add their figures up through PROMETHEUS_MULTIPROC_DIR (read by
# prometheus-client itself, from the environment, before the process starts; chat/runtime/metrics.py).
METRICS_TOKEN = env("METRICS_TOKEN")
# Each serving process gives the C library's free memory back to the system this often,
# seconds (chat/runtime/process_loops.py); 0: never (its RSS then keeps what a busy spell once took).
MEMORY_TRIM_SECONDS = env_number("MEMORY_TRIM_SECONDS", 10.0, float)

if not 0 < CHAT_COALESCE_MS <= 30:
    raise ImproperlyConfigured("CHAT_COALESCE_MS must be between 1 and 30")
if not 1 <= UPSTREAM_MAX_TOKENS <= MAX_TOKENS_LIMIT:
    raise ImproperlyConfigured("UPSTREAM_MAX_TOKENS must be between 1 and MAX_TOKENS_LIMIT")
if BUDGET_DEFAULT_USD is not None and not (BUDGET_DEFAULT_USD.is_finite() and BUDGET_DEFAULT_USD >= 0):
    raise ImproperlyConfigured("BUDGET_DEFAULT_USD must be an amount of USD, 0 or more")
if BUDGET_DEFAULT_TOKENS is not None and BUDGET_DEFAULT_TOKENS < 0:
    raise ImproperlyConfigured("BUDGET_DEFAULT_TOKENS must be 0 or more")
if ATTACHMENT_MAX_UPLOADS_IN_FLIGHT < 1:
    raise ImproperlyConfigured("ATTACHMENT_MAX_UPLOADS_IN_FLIGHT must be at least 1")
if CHAT_FRAME_RATE <= 0 or CHAT_FRAME_BURST < 1 or API_MAX_N < 1:
    raise ImproperlyConfigured("CHAT_FRAME_RATE, CHAT_FRAME_BURST and API_MAX_N must be positive")
if CHAT_MAX_SOCKETS_PER_PERSON < 0:
    raise ImproperlyConfigured("CHAT_MAX_SOCKETS_PER_PERSON must be 0 (no limit) or more")
if min(AUTH_LOCKOUT_FAILURES, AUTH_LOCKOUT_MINUTES, AUTH_HASH_CONCURRENCY) < 1:
    raise ImproperlyConfigured("AUTH_LOCKOUT_FAILURES, AUTH_LOCKOUT_MINUTES, AUTH_HASH_CONCURRENCY must be 1 or more")

# --- Accounts: invites, sign-up, e-mail (chat/auth/invites.py) --------------------------------
# Where people reach this server, for the links in invites (reset links use the request's own address).
SITE_URL = env("SITE_URL", f"http://127.0.0.1:{PUBLIC_PORT}").rstrip("/")
INVITE_DAYS = env_number("INVITE_DAYS", 7)
# Anyone may ask for an invite to their own e-mail address; with SIGNUP_DOMAINS, only at those domains.
SIGNUP_OPEN = env_bool("SIGNUP_OPEN", False)
SIGNUP_DOMAINS = [domain.lower().lstrip("@") for domain in env_list("SIGNUP_DOMAINS")]
# E-mail: EMAIL_URL (chatsite/mailconfig.py), or Django's EMAIL_* settings one by one;
# with neither, messages are printed to the console, so `make run` needs no mail server.
if env("EMAIL_URL"):
    try:
        globals().update(mailconfig.parse(env("EMAIL_URL")))
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
else:
    EMAIL_HOST = env("EMAIL_HOST")
    EMAIL_BACKEND = env(
        "EMAIL_BACKEND", f"django.core.mail.backends.{'smtp' if EMAIL_HOST else 'console'}.EmailBackend"
    )
    EMAIL_HOST = EMAIL_HOST or "localhost"
    EMAIL_PORT = env_number("EMAIL_PORT", 25)
    EMAIL_HOST_USER = env("EMAIL_HOST_USER")
    EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
    EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "chat@localhost")
EMAIL_TIMEOUT = env_number("EMAIL_TIMEOUT", 10)

# Single sign-on by OpenID Connect (chat/auth/oidc.py): on when OIDC_ISSUER is set.
OIDC_ISSUER = env("OIDC_ISSUER")
OIDC_NAME = env("OIDC_NAME", "single sign-on")  # the button says "Sign in with <this>"
OIDC_USERNAME_CLAIM = env("OIDC_USERNAME_CLAIM", "email")
OIDC_ALLOWED_DOMAINS = [domain.lower().lstrip("@") for domain in env_list("OIDC_ALLOWED_DOMAINS")]
OIDC_CREATE_USER = env_bool("OIDC_CREATE_USERS", True)  # mozilla-django-oidc's name for it
OIDC_RP_CLIENT_ID = env("OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env("OIDC_CLIENT_SECRET")
OIDC_RP_SIGN_ALGO = env("OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env("OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_number("OIDC_TIMEOUT", 10.0, float)
OIDC_AUTHENTICATE_CLASS = "chat.auth.oidc.SignInView"
OIDC_CALLBACK_CLASS = "chat.auth.oidc.CallbackView"
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"
# Whether the sign-in page offers the password form (and passwords sign in at all).
AUTH_PASSWORD_LOGIN = env_bool("AUTH_PASSWORD_LOGIN", True)
if OIDC_ISSUER:
    if not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
        raise ImproperlyConfigured("OIDC_ISSUER needs OIDC_CLIENT_ID and OIDC_CLIENT_SECRET")
    AUTHENTICATION_BACKENDS.append("chat.auth.oidc.Backend")
# LDAP sign-in (django-auth-ldap, requirements-ldap.txt): on when LDAP_SERVER_URI is set. People
# sign in with the password form; their account here is made (or updated) from the directory.
LDAP_SERVER_URI = env("LDAP_SERVER_URI")
if LDAP_SERVER_URI:
    import ldap
    from django_auth_ldap.config import LDAPSearch

    AUTH_LDAP_SERVER_URI = LDAP_SERVER_URI
    AUTH_LDAP_START_TLS = env_bool("LDAP_START_TLS", False)
    AUTH_LDAP_BIND_DN = env("LDAP_BIND_DN")
    AUTH_LDAP_BIND_PASSWORD = env("LDAP_BIND_PASSWORD")
    AUTH_LDAP_USER_SEARCH = LDAPSearch(
        env("LDAP_USER_BASE"), ldap.SCOPE_SUBTREE, env("LDAP_USER_FILTER", "(uid=%(user)s)")
    )
    AUTH_LDAP_USER_ATTR_MAP = {"email": env("LDAP_EMAIL_ATTR", "mail"), "first_name": "givenName", "last_name": "sn"}
    AUTH_LDAP_CONNECTION_OPTIONS = {ldap.OPT_NETWORK_TIMEOUT: env_number("LDAP_TIMEOUT", 10.0, float)}
    # Before the local passwords: a directory account signs in with its directory password.
    AUTHENTICATION_BACKENDS.insert(1, "chat.auth.directory.DirectoryBackend")
if not AUTH_PASSWORD_LOGIN:
    if not OIDC_ISSUER:
        raise ImproperlyConfigured("AUTH_PASSWORD_LOGIN=0 needs another way in: set OIDC_ISSUER")
    AUTHENTICATION_BACKENDS.remove("chat.auth.signin.BoundedModelBackend")
if INVITE_DAYS < 1:
    raise ImproperlyConfigured("INVITE_DAYS must be 1 or more")

# 0 would stop every stream, request or save rather than turn anything off.
POSITIVE = {
    "DATABASE_THREADS": DATABASE_THREADS, "REQUEST_MAX_BYTES": DATA_UPLOAD_MAX_MEMORY_SIZE,
    "RESPONSES_MAX_HISTORY_BYTES": RESPONSES_MAX_HISTORY_BYTES, "API_MAX_BODY_BYTES": API_MAX_BODY_BYTES,
    "UPSTREAM_DEADLINE": UPSTREAM_DEADLINE, "UPSTREAM_CONNECT_TIMEOUT": UPSTREAM_CONNECT_TIMEOUT,
    "UPSTREAM_READ_TIMEOUT": UPSTREAM_READ_TIMEOUT, "UPSTREAM_FIRST_BYTE_TIMEOUT": UPSTREAM_FIRST_BYTE_TIMEOUT,
    "CHAT_SAVE_INTERVAL": CHAT_SAVE_INTERVAL, "API_SLOW_CLIENT_SECONDS": API_SLOW_CLIENT_SECONDS,
    "CHAT_SLOW_CLIENT_SECONDS": CHAT_SLOW_CLIENT_SECONDS, "API_HEARTBEAT_SECONDS": API_HEARTBEAT_SECONDS,
    "API_CHECKPOINT_SECONDS": API_CHECKPOINT_SECONDS, "CHAT_BATCH_ROWS": CHAT_BATCH_ROWS,
    "CHAT_PAGE_MESSAGES": CHAT_PAGE_MESSAGES, "MAX_TOKENS_LIMIT": MAX_TOKENS_LIMIT,
}  # fmt: skip
if zero := [name for name, value in POSITIVE.items() if not value > 0]:
    raise ImproperlyConfigured(f"{', '.join(zero)} must be more than 0")

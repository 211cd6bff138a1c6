"""Settings for ferrum-memory.

Every knob is an environment variable read here, once, through one ``environ.Env``. With no
variable set the service runs embedded: SQLite in WAL mode, Celery on a SQLite broker, no
Redis or Qdrant server. ``.env.example`` and the README list the same variables.
"""

import secrets
from datetime import timedelta
from pathlib import Path

import environ

from ferrum_memory.core.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    env.read_env(BASE_DIR / ".env")

# Where the embedded engines keep their files (SQLite DB, broker, index shard, secret key).
DATA_DIR = Path(env.str("FERRUM_DATA_DIR", default=str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)


# GENERAL
# ------------------------------------------------------------------------------
def _secret_key() -> str:
    """DJANGO_SECRET_KEY, or a random key kept in the data folder.

    No secret has a built-in default: an install without DJANGO_SECRET_KEY gets its own random
    key, stored next to its database so sessions survive restarts.
    """
    configured = env.str("DJANGO_SECRET_KEY", default="")
    if configured:
        return configured
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.touch(mode=0o600)
        key_file.write_text(secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
TIME_ZONE = "UTC"
USE_TZ = True
LANGUAGE_CODE = "en-us"
ROOT_URLCONF = "ferrum_memory.urls"
WSGI_APPLICATION = "ferrum_memory.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The API paths are fixed by the spec, with and without a slash: never redirect a POST.
APPEND_SLASH = False

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "django_prometheus",
    "ferrum_memory.core",
    "memory",
    "experience",
    "sessions.apps.SessionsConfig",
    "agents",
]

# No django-prometheus middleware: its dozen django_http_* series per request cost about a
# tenth of a trivial request (bench/web.py); ferrum_api_request_duration_seconds, observed
# once per request, counts and times every request by route, verb and status.
MIDDLEWARE = [
    # Request id, per-operation latency and the access line; inside the request's span, which
    # the OpenTelemetry Django instrumentation puts first when tracing is on.
    "ferrum_memory.core.telemetry.RequestTelemetryMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Sessions, the logged-in user and messages run under /admin/ only (core/middleware.py):
    # the API reads no cookie. Django's own classes otherwise, in Django's order.
    "ferrum_memory.core.middleware.AdminSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "ferrum_memory.core.middleware.AdminAuthenticationMiddleware",
    "ferrum_memory.core.middleware.AdminMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# DATABASES
# ------------------------------------------------------------------------------
# DATABASE_URL (PostgreSQL) when scaled out; otherwise the SQLite file at SQLITE_PATH.
SQLITE_PATH = Path(env.str("SQLITE_PATH", default=str(DATA_DIR / "ferrum_memory.sqlite3")))
# Bytes of the SQLite file each connection reads through a memory map (SQLite caps it at 2 GiB);
# 0 reads with read() calls.
SQLITE_MMAP_SIZE = env.int("SQLITE_MMAP_SIZE", default=2**31)
if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db("DATABASE_URL")}
    # A dropped connection fails one request at most: the next one reconnects.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                # WAL lets the web, worker and beat processes read while one of them writes;
                # IMMEDIATE takes the write lock up front, so concurrent writers wait (up to
                # the timeout) instead of failing with "database is locked" mid-transaction.
                # secure_delete: a deleted row's bytes are overwritten with zeros, so that an
                # erased agent's content is not left in free pages of the file (agents app).
                # mmap_size: pages are read through a memory map, not a read() each (SQLite
                # writes with write() all the same, so a full disk fails a write, no SIGBUS):
                # a search's 10 rows at 10^5 items, 1.1 -> 0.6 ms (bench/README).
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                f"PRAGMA secure_delete=ON; PRAGMA mmap_size={SQLITE_MMAP_SIZE};",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
# Each web thread keeps its connection between requests, on either engine. For SQLite too:
# opening one (the file, three PRAGMAs, Django's SQL functions) cost more than a whole
# trivial request's work (bench/web.py).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)

# CACHES (API throttling)
# ------------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # Throttling fails open when Redis is down (core/throttling.py); a short timeout keeps
            # an unreachable Redis from holding every request.
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    # A file cache is shared by every process on the machine, unlike the per-process locmem.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": DATA_DIR / "cache",
        }
    }

# CELERY
# ------------------------------------------------------------------------------
# Redis when scaled out; otherwise kombu's SQLAlchemy transport on a SQLite file.
CELERY_BROKER_URL = env.str(
    "CELERY_BROKER_URL",
    default=REDIS_URL or f"sqla+sqlite:///{DATA_DIR / 'celery-broker.sqlite3'}",
)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 300
CELERY_TASK_TIME_LIMIT = 360
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE
# The worker logs through LOGGING below (JSON lines with the ids), not Celery's own format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# QDRANT, EMBEDDINGS, WORKING MEMORY, REPLAY
# ------------------------------------------------------------------------------
QDRANT_URL = env.str("QDRANT_URL", default="")
QDRANT_COLLECTION = env.str("QDRANT_COLLECTION", default="ferrum_memory")
# How long /health waits for a process's vector index to be (re)built; past it the build goes on
# in the background and /health answers "degraded", the index "rebuilding".
VECTOR_INDEX_HEALTH_WAIT_SECONDS = env.float("VECTOR_INDEX_HEALTH_WAIT_SECONDS", default=5.0)
# Embedded engine only: N > 0 keeps the index in N processes of its own (`manage.py
# memory_index_server`), which build its graphs off every request's path; 0 gives each web and
# worker process its own copy, whose graphs are built inside the request that crosses a threshold.
VECTOR_INDEX_SERVERS = env.int("VECTOR_INDEX_SERVERS", default=0)
# Embedded engine only: the threads of each shard's search pool, which reads its segments in
# parallel. One searches on the calling thread: at 10^5 items of one agent (2 segments) it cost
# 1.3 ms less CPU and 1 ms less latency per search than the CPU-derived default (bench/README).
VECTOR_INDEX_SEARCH_THREADS = env.int("VECTOR_INDEX_SEARCH_THREADS", default=1)
FASTEMBED_MODEL = env.str("FASTEMBED_MODEL", default="sentence-transformers/all-MiniLM-L6-v2")
# A local folder with the model's files; empty: the default model from its PyPI packages, or
# fastembed's cache for another model (nothing is downloaded at run time).
FASTEMBED_MODEL_PATH = env.str("FASTEMBED_MODEL_PATH", default="")
FASTEMBED_THREADS = env.int("FASTEMBED_THREADS", default=1)
# Queries of the default model embedded with int8 matrix products (memory.embeddings).
FASTEMBED_QUERY_INT8 = env.bool("FASTEMBED_QUERY_INT8", default=True)
# A fastembed cross-encoder for ?rerank=true (and a local folder for it); empty: rerank is off.
FASTEMBED_RERANK_MODEL = env.str("FASTEMBED_RERANK_MODEL", default="")
FASTEMBED_RERANK_MODEL_PATH = env.str("FASTEMBED_RERANK_MODEL_PATH", default="")
# Cosine similarity from which a new memory of the same agent is merged into an existing one.
MEMORY_NEAR_DUPLICATE = env.float("MEMORY_NEAR_DUPLICATE", default=0.95)
# Hybrid search's neighbour context (memory.selectors): an episodic hit of a session gains
# this share of its best adjacent item's score; 0 turns it off.
MEMORY_NEIGHBOUR_WEIGHT = env.float("MEMORY_NEIGHBOUR_WEIGHT", default=0.3)
# Hybrid search's sentence vectors (memory.vector_index): the share of an item's dense score
# that its best sentence gives; 0 turns it off (they are stored and indexed either way).
MEMORY_SENTENCE_WEIGHT = env.float("MEMORY_SENTENCE_WEIGHT", default=0.3)
# Hybrid search's previous-turn words (memory.vector_index): the weight of a turn's BM25 score
# as a document holding its previous turn's words too, beside its own; 0 turns it off (the
# vectors are indexed either way).
MEMORY_PREVIOUS_TURN_WEIGHT = env.float("MEMORY_PREVIOUS_TURN_WEIGHT", default=0.3)
# Hybrid search's session diversity (memory.vector_index): each hit of a session ranked below
# another of it loses this many standard deviations of the pool's scores; 0 turns it off.
MEMORY_SESSION_DIVERSITY = env.float("MEMORY_SESSION_DIVERSITY", default=0.25)
# Hybrid search's late interaction (memory.vector_index): the weight of an item's MaxSim over
# the query's content tokens in the fusion, beside the dense and BM25 scores (1 each); 0 turns
# it off (the token vectors are stored and indexed either way).
MEMORY_TOKEN_WEIGHT = env.float("MEMORY_TOKEN_WEIGHT", default=2.0)
# POST /memory/context: the tokenizer that counts its budget (memory.tokens), and the default
# relevance below which a memory is left out of a context (calibrated by bench/context.py).
CONTEXT_TOKENIZER = env.str("CONTEXT_TOKENIZER", default="o200k_base")
CONTEXT_MIN_RELEVANCE = env.float("CONTEXT_MIN_RELEVANCE", default=0.5)
DEFAULT_MEMORY_TTL = env.int("DEFAULT_MEMORY_TTL", default=0)
DEFAULT_REPLAY_TTL = env.int("DEFAULT_REPLAY_TTL", default=86400)
DEFAULT_WORKING_MEM_TTL = env.int("DEFAULT_WORKING_MEM_TTL", default=86400)

# API
# ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ferrum_memory.core.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["ferrum_memory.core.permissions.HasApiKey"],
    "DEFAULT_THROTTLE_CLASSES": ["ferrum_memory.core.throttling.ApiKeyRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"api_key": env.str("API_THROTTLE_RATE", default="6000/min")},
    # orjson: the stdlib JSON encoder and decoder were a large part of a request's CPU.
    "DEFAULT_RENDERER_CLASSES": ["ferrum_memory.core.renderers.OrjsonRenderer"],
    "DEFAULT_PARSER_CLASSES": ["ferrum_memory.core.parsers.OrjsonParser"],
    "DEFAULT_SCHEMA_CLASS": "ferrum_memory.core.schema.AutoSchema",
    "EXCEPTION_HANDLER": "ferrum_memory.core.exceptions.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
}

# Seconds an API key stays cached in each web process: a key revoked or edited elsewhere (another
# worker, a management command) still works for up to this long; 0: read on every request.
API_KEY_CACHE_SECONDS = env.float("API_KEY_CACHE_SECONDS", default=5.0)

# The largest request body (a 400 beyond it): a session's working memory
# (SESSION_MAX_STATE_BYTES) with room to spare, or a batch of 1,000 experiences of up to 16 KiB
# each on average (one experience may hold more, so a batch of large ones must be split).
DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024

SPECTACULAR_SETTINGS = {
    "TITLE": "ferrum-memory",
    "DESCRIPTION": "Working memory, long-term memory and experience replay for learning agents.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # 3.1 (JSON Schema 2020-12): `propertyNames` says that no key of free-form JSON holds a NUL.
    "OAS_VERSION": "3.1.0",
    # Swagger UI and Redoc from the drf-spectacular-sidecar package: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies get their own components, so a required text field says minLength 1.
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ferrum_memory.core.schema.document_error_responses",
        "ferrum_memory.core.schema.describe_nul_free_bodies",
        "experience.schema.td_error_body_with_updates_is_a_batch",
        "experience.schema.experience_links",
        "memory.schema.memory_links",
        "memory.schema.cross_field_rules",
        "sessions.schema.session_links",
    ],
    # Two `status` enums in the schema (a dream cycle's, and /health's ok/error): named here,
    # or drf-spectacular warns and hashes the names.
    "ENUM_NAME_OVERRIDES": {
        "DreamCycleStatusEnum": "experience.models.DreamCycle.Status",
        "StatusEnum": ["ok", "error"],
        "MemoryKindEnum": "memory.models.MemoryItem.Kind",
        "MemorySourceEnum": "memory.models.MemoryItem.Source",
        "MemorySensitivityEnum": "memory.models.MemoryItem.Sensitivity",
        "MemoryEventKindEnum": "memory.models.MemoryEvent.Kind",
    },
}

# OBSERVABILITY (see ferrum_memory/core/telemetry.py and the README's Observability section)
# ------------------------------------------------------------------------------
# JSON lines on stderr with the request id and trace id, from every process.
LOGGING = logging_config(env.str("LOG_LEVEL", default="INFO"))
OTEL_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", default="ferrum-memory")
# An OTLP/HTTP collector, e.g. http://otel-collector:4318; empty: tracing is off.
OTEL_EXPORTER_OTLP_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="")
# host:port where the Celery worker serves its Prometheus metrics; empty: not served.
WORKER_METRICS_BIND = env.str("WORKER_METRICS_BIND", default="")

# REPLAY (prioritized experience replay, Schaul et al. 2015)
# ------------------------------------------------------------------------------
REPLAY_ALPHA = env.float("REPLAY_ALPHA", default=0.6)
REPLAY_BETA = env.float("REPLAY_BETA", default=0.4)
REPLAY_EPSILON = env.float("REPLAY_EPSILON", default=1e-6)
# Tombstones older than this are purged; a replay index that fell further behind rebuilds.
REPLAY_TOMBSTONE_RETENTION = env.int("REPLAY_TOMBSTONE_RETENTION", default=3600)
# Replay controls: the defaults of an agent with no settings of its own (GET/PUT
# /experience/settings and the admin set one agent's; see experience/replay_services.py).
# Capacity per agent (0: none); past it an insert removes items by REPLAY_REMOVER (fifo:
# oldest first, or lowest_priority) in its own transaction.
REPLAY_MAX_SIZE = env.int("REPLAY_MAX_SIZE", default=0)
REPLAY_REMOVER = env.str("REPLAY_REMOVER", default="fifo")
# An item drawn this many times is retired: no replay draws it again (0: no cap).
REPLAY_MAX_TIMES_SAMPLED = env.int("REPLAY_MAX_TIMES_SAMPLED", default=0)
# The samples-per-insert rate limiter (Reverb's SampleToInsertRatio; 0: no limiter): replay
# waits for REPLAY_MIN_SIZE items, then grants draws while
# samples <= (inserts - min_size) * samples_per_insert + tolerance.
REPLAY_MIN_SIZE = env.int("REPLAY_MIN_SIZE", default=0)
REPLAY_SAMPLES_PER_INSERT = env.float("REPLAY_SAMPLES_PER_INSERT", default=0.0)
REPLAY_SPI_TOLERANCE = env.float("REPLAY_SPI_TOLERANCE", default=0.0)
# Interval of the default beat schedule that records each agent's counters for the dashboard.
REPLAY_SNAPSHOT_SECONDS = env.int("REPLAY_SNAPSHOT_SECONDS", default=300)

# DREAM CYCLES (scheduled replay handed to a learner; see experience/dream_services.py)
# ------------------------------------------------------------------------------
# An agent gets a cycle on each run once it holds at least this many sampleable experiences.
DREAM_MIN_EXPERIENCES = env.int("DREAM_MIN_EXPERIENCES", default=64)
DREAM_BATCH_SIZE = env.int("DREAM_BATCH_SIZE", default=32)
DREAM_STRATEGY = env.str("DREAM_STRATEGY", default="prioritized")
# Seconds, for the recency strategy: an item this old weighs half a new one.
DREAM_HALF_LIFE = env.float("DREAM_HALF_LIFE", default=3600.0)
# Beta goes linearly from DREAM_BETA0 (an agent's first cycle) to 1 over this many cycles.
DREAM_BETA0 = env.float("DREAM_BETA0", default=REPLAY_BETA)
DREAM_BETA_ANNEAL_CYCLES = env.int("DREAM_BETA_ANNEAL_CYCLES", default=1000)
DREAM_LEASE_SECONDS = env.int("DREAM_LEASE_SECONDS", default=300)
# An agent with this many cycles not yet completed gets no new one until a learner catches up
# (0: no limit), so a buffer nobody learns from is not sampled forever.
DREAM_MAX_PENDING = env.int("DREAM_MAX_PENDING", default=10)
# The default beat schedule; once created it is edited in the admin, not here.
DREAM_INTERVAL_SECONDS = env.int("DREAM_INTERVAL_SECONDS", default=300)

# SESSIONS (working memory and its consolidation into long-term memory)
# ------------------------------------------------------------------------------
# The beat consolidates a session idle for this share of its TTL, before the store forgets it.
SESSION_IDLE_FRACTION = env.float("SESSION_IDLE_FRACTION", default=0.8)
SESSION_SWEEP_SECONDS = env.int("SESSION_SWEEP_SECONDS", default=60)
# Size limits of one session's working memory (400 beyond them).
SESSION_MAX_STATE_BYTES = env.int("SESSION_MAX_STATE_BYTES", default=1_000_000)
SESSION_MAX_MESSAGES = env.int("SESSION_MAX_MESSAGES", default=2_000)
# A dotted path to a callable(state=, lines=, picked=) -> str that writes the session summary
# (e.g. with an LLM); empty: extractive, embedding-based, no LLM.
SESSION_SUMMARIZER = env.str("SESSION_SUMMARIZER", default="")
# The extractive consolidation keeps at most this share of a session's words (turn lines).
SESSION_CONSOLIDATION_SHARE = env.float("SESSION_CONSOLIDATION_SHARE", default=0.22)
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"].update(  # type: ignore[attr-defined]
    {
        "SessionStatusEnum": "sessions.models.Session.Status",
        "ConsolidationStatusEnum": "sessions.models.Consolidation.Status",
    }
)

# ADMIN HARDENING (login limits, security headers, content security policy; README "Security")
# ------------------------------------------------------------------------------
INSTALLED_APPS += ["axes", "csp"]
# django-axes refuses a username from an address after ADMIN_LOGIN_FAILURE_LIMIT failed logins,
# for ADMIN_LOGIN_COOLOFF_MINUTES. It counts failures in the database: shared by every process on
# SQLite and PostgreSQL alike, kept across restarts, and not lost or failing open with Redis down.
# Username and address together, so that nobody can lock an admin out from elsewhere.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: it refuses a locked-out login
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("ADMIN_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("ADMIN_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# Proxies in front that append to X-Forwarded-For (0: the address is the connection's).
ADMIN_LOGIN_TRUSTED_PROXIES = env.int("ADMIN_LOGIN_TRUSTED_PROXIES", default=0)
AXES_CLIENT_IP_CALLABLE = "ferrum_memory.core.client_ip.client_ip"
AXES_RESET_ON_SUCCESS = True
# The CSP header on every HTML page (django-csp: Django 5.2 has no built-in CSP; through
# core/csp.py). The admin and the replay dashboard load scripts and styles from static files
# only: no inline code allowed.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
    # Swagger UI (drf-spectacular's page) needs its inline script and style.
    "EXCLUDE_URL_PREFIXES": ["/docs"],
}
# Django's own headers, stated rather than left to defaults: nosniff, no framing, the referrer
# only to this origin, and a browsing context of its own (SecurityMiddleware, XFrameOptions).
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# The CSP header is added on the way out; axes must be the last middleware (its documentation).
MIDDLEWARE += ["ferrum_memory.core.csp.HtmlCSPMiddleware", "axes.middleware.AxesMiddleware"]

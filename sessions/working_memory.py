"""The working-memory store: the only module that imports redis.

One interface, two engines: Redis when REDIS_URL is set (a hash per session, key TTL refreshed
on every write), or the WorkingMemoryEntry table when embedded (expiry by expires_at). A state
is a JSON object with an integer `version`; `replace` is a compare-and-set on it, so two
writers never both win. Lazy, lock-guarded singleton; `reset_working_memory()` for tests.
"""

import logging
import threading
from abc import ABC, abstractmethod
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import redis
from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from ferrum_memory.core.exceptions import Unavailable
from ferrum_memory.core.metrics import WORKING_MEMORY_ERRORS

from .models import WorkingMemoryEntry

logger = logging.getLogger(__name__)

KEY_PREFIX = "ferrum:wm:"
CONNECT_TIMEOUT_SECONDS = 2.0
SOCKET_TIMEOUT_SECONDS = 5.0

State = dict[str, Any]


class WorkingMemoryUnavailable(Unavailable):
    """The store does not answer: session endpoints give 503, nothing else is affected."""


class VersionConflict(Exception):
    """A compare-and-set lost: `current` is the stored version, None when the state is gone."""

    def __init__(self, current: int | None) -> None:
        super().__init__(f"current version {current}")
        self.current = current


class WorkingMemoryStore(ABC):
    engine: str
    url: str = ""

    @abstractmethod
    def create(self, *, session_id: str, state: State, ttl: int) -> None:
        """Write a new session's state; it lives `ttl` seconds unless replaced."""

    @abstractmethod
    def get(self, *, session_id: str, include_expired: bool = False) -> State | None:
        """The live state, or None when there is none. `include_expired` also returns a state
        past its TTL that the engine still holds (only the database keeps them until purged)."""

    @abstractmethod
    def replace(self, *, session_id: str, expected_version: int, state: State, ttl: int) -> None:
        """Write `state` if the stored version is `expected_version`, and refresh the TTL;
        raise VersionConflict otherwise (current None: no live state)."""

    @abstractmethod
    def delete(self, *, session_id: str) -> None: ...

    @abstractmethod
    def purge_expired(self, *, now: datetime) -> int:
        """Drop states past their TTL (the database's job; Redis expires keys itself)."""

    @abstractmethod
    def ping(self) -> dict[str, Any]:
        """Raise WorkingMemoryUnavailable when down; details for /health when up."""


class DatabaseStore(WorkingMemoryStore):
    engine = "database"

    def create(self, *, session_id: str, state: State, ttl: int) -> None:
        WorkingMemoryEntry.objects.create(
            session_id=session_id,
            agent_id=state["agent_id"],
            state=state,
            version=state["version"],
            expires_at=timezone.now() + timedelta(seconds=ttl),
        )

    def get(self, *, session_id: str, include_expired: bool = False) -> State | None:
        entries = WorkingMemoryEntry.objects.filter(session_id=session_id)
        if not include_expired:
            entries = entries.filter(expires_at__gt=timezone.now())
        return entries.values_list("state", flat=True).first()

    def replace(self, *, session_id: str, expected_version: int, state: State, ttl: int) -> None:
        now = timezone.now()
        live = WorkingMemoryEntry.objects.filter(session_id=session_id, expires_at__gt=now)
        written = live.filter(version=expected_version).update(
            state=state, version=state["version"], expires_at=now + timedelta(seconds=ttl)
        )
        if not written:
            raise VersionConflict(live.values_list("version", flat=True).first())

    def delete(self, *, session_id: str) -> None:
        WorkingMemoryEntry.objects.filter(session_id=session_id).delete()

    def purge_expired(self, *, now: datetime) -> int:
        deleted, _ = WorkingMemoryEntry.objects.filter(expires_at__lte=now).delete()
        return deleted

    def ping(self) -> dict[str, Any]:
        return {"engine": self.engine, "live": self.live_count()}

    def live_count(self) -> int:
        return WorkingMemoryEntry.objects.filter(expires_at__gt=timezone.now()).count()


# KEYS[1] the session's hash; ARGV: expected version, new version, state JSON, TTL ms.
# Returns -2 when written, -1 when there is no state, else the current version.
_REPLACE = """
local current = redis.call('HGET', KEYS[1], 'v')
if not current then return -1 end
if current ~= ARGV[1] then return tonumber(current) end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return -2
"""
# Returns 1 when created, 0 when the key exists.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urlunsplit(parts._replace(netloc=netloc))


class RedisStore(WorkingMemoryStore):
    engine = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            health_check_interval=30,
        )
        self._replace = self.client.register_script(_REPLACE)
        self._create = self.client.register_script(_CREATE)

    def _down(self, exc: Exception) -> WorkingMemoryUnavailable:
        WORKING_MEMORY_ERRORS.labels(engine=self.engine).inc()
        logger.warning("working memory (Redis) unavailable: %s", exc)
        return WorkingMemoryUnavailable(
            f"Working memory is unavailable: Redis at {redacted(self.url)} does not answer "
            f"({type(exc).__name__}). Session endpoints answer 503 until it is back; memory "
            "and experience endpoints are not affected."
        )

    @staticmethod
    def key(session_id: str) -> str:
        return f"{KEY_PREFIX}{session_id}"

    def create(self, *, session_id: str, state: State, ttl: int) -> None:
        try:
            created = self._create(
                keys=[self.key(session_id)],
                args=[state["version"], orjson.dumps(state), ttl * 1000],
            )
        except _REDIS_DOWN as exc:
            raise self._down(exc) from exc
        if not created:
            raise IntegrityError(f"working memory for session {session_id} exists")

    def get(self, *, session_id: str, include_expired: bool = False) -> State | None:
        try:
            raw = self.client.hget(self.key(session_id), "s")
        except _REDIS_DOWN as exc:
            raise self._down(exc) from exc
        return orjson.loads(raw) if raw is not None else None

    def replace(self, *, session_id: str, expected_version: int, state: State, ttl: int) -> None:
        try:
            result = int(
                self._replace(
                    keys=[self.key(session_id)],
                    args=[expected_version, state["version"], orjson.dumps(state), ttl * 1000],
                )
            )
        except _REDIS_DOWN as exc:
            raise self._down(exc) from exc
        if result != -2:
            raise VersionConflict(None if result == -1 else result)

    def ttl_ms(self, *, session_id: str) -> int:
        """Milliseconds the key has left (-2: none), for tests and the admin."""
        return int(self.client.pttl(self.key(session_id)))

    def delete(self, *, session_id: str) -> None:
        try:
            self.client.delete(self.key(session_id))
        except _REDIS_DOWN as exc:
            raise self._down(exc) from exc

    def purge_expired(self, *, now: datetime) -> int:
        return 0  # Redis expires keys itself

    def ping(self) -> dict[str, Any]:
        try:
            self.client.ping()
        except _REDIS_DOWN as exc:
            raise self._down(exc) from exc
        return {"engine": self.engine, "url": redacted(self.url)}

    def close(self) -> None:
        self.client.close()


_store: WorkingMemoryStore | None = None
_lock = threading.Lock()


def get_working_memory() -> WorkingMemoryStore:
    """The configured store, made once per process (again if REDIS_URL changed, as in tests)."""
    global _store
    with _lock:
        url = settings.REDIS_URL
        if _store is None or _store.url != url:
            _close(_store)
            _store = RedisStore(url) if url else DatabaseStore()
        return _store


def reset_working_memory() -> None:
    global _store
    with _lock:
        _close(_store)
        _store = None


def _close(store: WorkingMemoryStore | None) -> None:
    if isinstance(store, RedisStore):
        store.close()

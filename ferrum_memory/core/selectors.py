import threading
import time

from django.conf import settings

from .models import ApiKey
from .services import api_key_hash

# Active keys by hash, each with the monotonic time it was read: every API request
# authenticates, and the lookup was a fifth of a trivial request's time (bench/web.py). Only
# found keys are kept, so unknown keys cannot fill it; a key created is usable at once.
_active_keys: dict[str, tuple[float, ApiKey]] = {}
_active_keys_lock = threading.Lock()
# Past this many entries, the expired ones are dropped (a few keys is the usual case).
_ACTIVE_KEYS_PRUNE_AT = 1024


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    """The active key `raw_key` names, or None.

    Read through a per-process cache of API_KEY_CACHE_SECONDS: a key revoked, rotated or
    edited in this process (admin, `create_api_key --rotate`) changes at once here, since
    those writes clear the cache (api_key_forget); done in another process (another web
    worker, a management command), it takes effect within API_KEY_CACHE_SECONDS."""
    digest = api_key_hash(raw_key)
    ttl = settings.API_KEY_CACHE_SECONDS
    now = time.monotonic()
    cached = _active_keys.get(digest)
    if cached is not None and now - cached[0] < ttl:
        return cached[1]
    api_key = ApiKey.objects.filter(key_hash=digest, is_active=True).first()
    with _active_keys_lock:
        if api_key is None or ttl <= 0:
            _active_keys.pop(digest, None)
            return api_key
        if len(_active_keys) >= _ACTIVE_KEYS_PRUNE_AT:
            for stale in [d for d, (read, _) in _active_keys.items() if now - read >= ttl]:
                del _active_keys[stale]
        _active_keys[digest] = (now, api_key)
    return api_key


def api_key_forget(*, key_hash: str | None = None) -> None:
    """Drop one key (or every key) from this process's cache, after a change to it."""
    with _active_keys_lock:
        if key_hash is None:
            _active_keys.clear()
        else:
            _active_keys.pop(key_hash, None)

import hashlib
import secrets
from collections.abc import Sequence
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from .models import ApiKey

KEY_PREFIX = "fm_"
# last_used_at is a hint for people, not an audit log: one write a minute per key at most.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def api_key_hash(raw_key: str) -> str:
    # Keys are 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def api_key_create(
    *, name: str, allowed_agent_ids: Sequence[str] = (), read_only: bool = False
) -> tuple[ApiKey, str]:
    """Create a key; return it with the raw key, which is never stored and cannot be shown again."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        name=name,
        prefix=raw_key[:10],
        key_hash=api_key_hash(raw_key),
        allowed_agent_ids=list(allowed_agent_ids),
        read_only=read_only,
    )
    return api_key, raw_key


def api_key_deactivate_by_name(*, name: str) -> int:
    # One save per key (a name has a few at most), not one UPDATE: each save clears the key
    # from the authentication cache (CoreConfig.ready), so a rotated key stops here at once.
    keys = list(ApiKey.objects.filter(name=name, is_active=True))
    for api_key in keys:
        api_key.is_active = False
        api_key.save(update_fields=["is_active"])
    return len(keys)


def api_key_touch(*, api_key: ApiKey) -> None:
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now

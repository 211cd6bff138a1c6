from .models import ApiKey
from .services import api_key_hash


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    return ApiKey.objects.filter(key_hash=api_key_hash(raw_key), is_active=True).first()

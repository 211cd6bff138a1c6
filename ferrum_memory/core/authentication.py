from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .models import ApiKey
from .selectors import api_key_get_active
from .services import api_key_touch


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <key>`; the key becomes both request.user and request.auth."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKey, ApiKey] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the key as 'Authorization: Bearer <key>'.")
        try:
            raw_key = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API key.") from None
        api_key = api_key_get_active(raw_key=raw_key)
        if api_key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        api_key_touch(api_key=api_key)
        return api_key, api_key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) to a request without a valid key.
        return f'{self.keyword} realm="ferrum-memory"'

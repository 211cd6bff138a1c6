from django.db import models


class ApiKey(models.Model):
    """A client's credential. Only a hash of the key is stored; the key is shown once."""

    name = models.CharField(max_length=100)
    # The first characters of the key, kept in clear so people can tell keys apart.
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    allowed_agent_ids = models.JSONField(
        default=list, blank=True, help_text="Agent ids this key may use; empty means every agent."
    )
    read_only = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_authenticated(self) -> bool:
        # DRF puts the authenticated principal in request.user; an API key is that principal.
        return True

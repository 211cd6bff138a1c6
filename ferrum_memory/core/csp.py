"""The content security policy, on the pages a browser renders."""

from csp.middleware import CSPMiddleware
from django.http import HttpRequest, HttpResponseBase


class HtmlCSPMiddleware(CSPMiddleware):
    """django-csp's middleware, for HTML responses only.

    A policy governs what a document may load and run; a JSON answer of the API loads nothing
    (and nosniff keeps a browser from reading it as HTML), while building the policy costs
    django-csp about as much as the rest of a small request's middleware together."""

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if not response.get("Content-Type", "").startswith("text/html"):
            return response
        return super().process_response(request, response)

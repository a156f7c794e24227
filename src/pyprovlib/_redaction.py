"""Secret redaction: what pyprovlib masks before anything reaches a log line, an Event, a
metric label or an exception message.

:func:`redact_value` masks values of secret-looking keys and the data of Secret objects;
:func:`scrub_text` masks secrets recognisable in free text (PEM private keys, bearer tokens,
JWTs, ``password=…`` pairs). The logging pipeline (:mod:`pyprovlib.runtime._logging`) applies
them to every record; the controllers apply :func:`scrub_text` to the messages they write into
Events and object statuses. It depends on nothing but the standard library, so every layer can
use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "mask_all", "redact", "redact_value", "scrub_text"]

REDACTED = "[REDACTED]"
"""What a masked value is replaced with."""

# Word parts (after splitting on separators and camelCase) that mark a key as secret.
_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "password",
        "passwords",
        "passwd",
        "passphrase",
        "token",
        "tokens",
        "apikey",
        "key",
        "credential",
        "credentials",
        "authorization",
        "private",
        "privatekey",
        "cookie",
    }
)
# A key whose last part names *where* a secret is rather than the secret itself
# (secret_name, csi.storage.k8s.io/provisioner-secret-namespace, token_file) stays visible:
# those values are what an operator needs to debug a misconfigured StorageClass.
_REFERENCE_SUFFIXES = frozenset({"name", "namespace", "ref", "file", "path", "dir", "type", "id"})
# client-go logs workqueue keys ("namespace/name") under "key"; masking them would blind every
# controller log line.
_PLAIN_KEYS = frozenset({"key", "keys", "queue_key", "object_key", "cache_key", "claim_key"})

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret value.

    Matches on word parts, so ``password``, ``apiKey``, ``client-key-data``, ``tls.key``,
    ``ssh-privatekey`` and ``csi.storage.k8s.io/secrets`` match while ``monkey`` and
    ``keyboard`` do not. Keys naming a reference to a secret (``secret_name``,
    ``...-secret-namespace``, ``token_file``) and workqueue keys (``key``) do not match.
    """
    if key.lower() in _PLAIN_KEYS:
        return False
    words = [w.lower() for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", key)) if w]
    if not words or words[-1] in _REFERENCE_SUFFIXES:
        return False
    return any(w in _SECRET_WORDS for w in words)


_PEM_PRIVATE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")
# key=value / "key": "value" / 'key': 'value' in free text, for key names that say secret.
_KV = re.compile(
    r"""(?ix)
    (?P<key>["']?[\w.-]*?
        (?:password|passwd|passphrase|secret|token|api[_-]?key|credential|private[_-]?key
           |authorization|[._-]key)
        [\w.-]*["']?)
    (?P<sep>\s*[:=]\s*)
    (?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s,;&)}\]]+)
    """
)
_SECRET_KIND = re.compile(r"""["']kind["']\s*:\s*["']Secret["']""")
_SECRET_DATA = re.compile(r"""(["'](?:data|stringData|string_data)["']\s*:\s*)\{[^{}]*\}""")


def _mask_kv(match: re.Match[str]) -> str:
    key = match.group("key")
    bare = key.strip("\"'")
    words = [w.lower() for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", bare)) if w]
    if words and words[-1] in _REFERENCE_SUFFIXES:
        return match.group(0)
    value = match.group("value")
    masked = value[0] + REDACTED + value[0] if value[:1] in "\"'" else REDACTED
    return key + match.group("sep") + masked


def scrub_text(text: str) -> str:
    """Mask secrets that can be recognised in free text: PEM private keys, ``Bearer``
    tokens, JWTs (service-account tokens), ``password=...``-style pairs and the data of
    Secret objects rendered as JSON or a Python dict."""
    if not text:
        return text
    text = _PEM_PRIVATE.sub(
        lambda m: (
            f"-----BEGIN {m.group(1)}PRIVATE KEY-----{REDACTED}-----END "
            f"{m.group(1)}PRIVATE KEY-----"
        ),
        text,
    )
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _JWT.sub(REDACTED, text)
    if _SECRET_KIND.search(text):
        text = _SECRET_DATA.sub(lambda m: f'{m.group(1)}"{REDACTED}"', text)
    return _KV.sub(_mask_kv, text)


def mask_all(value: Any) -> Any:
    """``value`` with every leaf masked, its shape (keys, lengths) kept."""
    # Keep the shape (map keys, list length) so the line still helps debugging.
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {k: mask_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [mask_all(v) for v in value]
    return REDACTED


def redact_value(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` with secrets masked: values of secret-looking keys (recursively in
    mappings and sequences), the ``data``/``stringData`` of Secret objects, and secrets
    recognisable in strings (:func:`scrub_text`). Objects with a ``to_dict()`` method
    (kubernetes-asyncio models, protobuf messages) are converted first; other objects are
    rendered with ``repr`` and scrubbed."""
    if _depth > 20:
        return REDACTED
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, bytes | bytearray):
        return scrub_text(repr(value))
    if isinstance(value, Mapping):
        is_secret_object = value.get("kind") == "Secret"
        out: dict[Any, Any] = {}
        for k, v in value.items():
            name = str(k)
            if is_secret_key(name) or (
                is_secret_object and name in ("data", "stringData", "string_data")
            ):
                out[k] = mask_all(v)
            else:
                out[k] = redact_value(v, _depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_value(v, _depth + 1) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        try:
            as_dict = to_dict()
        except Exception:  # a failing to_dict must not hide the log line
            as_dict = None
        if isinstance(as_dict, Mapping):
            return redact_value(as_dict, _depth + 1)
    return scrub_text(repr(value))


# exc_info is rendered later (with a scrubbing formatter); the rest are structlog's own.
_SKIP_KEYS = frozenset({"exc_info", "_record", "_from_structlog"})


def redact(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog processor: mask secrets in every value of the event (see :func:`redact_value`)."""
    for key in list(event_dict):
        if key in _SKIP_KEYS:
            continue
        value = event_dict[key]
        if key not in ("event", "logger", "level", "timestamp") and is_secret_key(key):
            event_dict[key] = mask_all(value)
        else:
            event_dict[key] = redact_value(value)
    return event_dict

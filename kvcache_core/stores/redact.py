"""Store URLs with their secrets taken out, for everything kvcache prints or reports.

Why here, once: a store URL becomes a report's target, a message or a hint, a pytest id and a
demo's output, and those end up in CI logs and code-scanning uploads. The built-in Redis stores
refuse a URL with a password, but the refusal itself used to print the URL; a third-party
store may accept one. So every place that turns a URL into text calls
[`redact_url`][kvcache_core.stores.redact.redact_url] (or
[`redact_text`][kvcache_core.stores.redact.redact_text] for a message that may quote it).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

__all__ = ["REDACTED", "SECRET_OPTIONS", "redact_text", "redact_url"]

REDACTED = "***"
"""What a secret is replaced with."""

SECRET_OPTIONS = re.compile(
    r"pass(word|wd)?|pwd|secret|token|credential|api_?key|access_?key|auth", re.I
)
"""Query options whose value is a secret (``password=``, ``token=``, ``api_key=``...). An option
naming where a secret is (``password_env=``) is not one."""


def _secret_option(name: str) -> bool:
    return bool(SECRET_OPTIONS.search(name)) and not name.lower().endswith("_env")


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and the values of secret-looking query
    options replaced by ``***``; a URL without either comes back unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not parsable as a URL: hide anything between "://" and "@"
        return re.sub(r"(://[^/@:]*:)[^/@]*@", rf"\1{REDACTED}@", url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            netloc = f"{user.split(':', 1)[0]}:{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_option(k) for k, _ in pairs):
            query = "&".join(
                f"{quote(k, safe='')}={REDACTED if _secret_option(k) else quote(v, safe='/:')}"
                for k, v in pairs
            )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str, url: str) -> str:
    """``text`` (a message about ``url``) with ``url`` and its secrets replaced by the
    redacted URL and ``***``."""
    safe = redact_url(url)
    if safe == url:
        return text
    out = text.replace(url, safe)
    parts = urlsplit(url)
    secrets = [parts.password, unquote(parts.password)] if parts.password else []
    secrets += [
        v for k, v in parse_qsl(parts.query, keep_blank_values=True) if _secret_option(k) and v
    ]
    for secret in secrets:
        if secret:
            out = out.replace(secret, REDACTED)
    return out

"""Keep secrets out of what moe-autotune logs (MLflow) and prints (error lines).

- `SECRET_NAME`: variable/field names that look like secrets; their values are never logged.
  (`PWD`, the shell's working directory, matches too: dropping it loses nothing worth a leak.)
- `redact_uri(text)`: every `scheme://user:password@host/...` in a string becomes `scheme://***@host/...`
  (user-only and password-only credentials too), and URL query values named like secrets become `***`.
- `redact_mapping(data)`: the same over a nested dict/list (a spec dump): secret-named keys get `***`.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|KEY|PASS|PWD|SECRET|CREDENTIAL|CRED|AUTH|PRIVATE|COOKIE|SIGNATURE", re.I)
# scheme:// and what follows up to whitespace or a quote (a URI inside repr() or a sentence)
_URI = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>`]*)")
_QUERY_SECRET = re.compile(r"(?P<key>[?&;][^=&#;\s]*(?:token|key|pass|pwd|secret|cred|auth|signature)[^=&#;\s]*=)"
                           r"[^&#;\s]*", re.I)


def _strip_userinfo(rest: str) -> str:
    """`user:pw@host/path` -> `***@host/path` (the authority ends at the first / ? #)."""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at < 0 and ":" in rest[:end] and "@" in rest[end:]:
        # a password with '/', '?' or '#' in it (`user:ab/cd@host`): the userinfo runs to the last '@'
        port = rest[rest.find(":") + 1:end]
        if not port.isdigit():
            at = rest.rfind("@")
    if at < 0:
        return rest
    return MASK + rest[at:]


def redact_uri(text: str) -> str:
    """`text` with the credentials of every URI in it replaced by ***; scheme, host and path are kept."""
    if not isinstance(text, str) or "://" not in text:
        return text

    def one(match: re.Match) -> str:
        rest = _QUERY_SECRET.sub(lambda m: m.group("key") + MASK, _strip_userinfo(match.group("rest")))
        return match.group("scheme") + rest

    return _URI.sub(one, text)


def redact_mapping(data: Any) -> Any:
    """A copy of nested dicts/lists with secret-named keys masked and credentials stripped from URIs."""
    if isinstance(data, dict):
        return {k: (MASK if isinstance(k, str) and SECRET_NAME.search(k) and v not in (None, "")
                    else redact_mapping(v)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_mapping(v) for v in data]
    if isinstance(data, str):
        return redact_uri(data)
    return data


def redact_environment(environ: dict[str, str]) -> dict[str, str]:
    """Variables whose names look like secrets are dropped; credentials in the other values are stripped."""
    return {k: redact_uri(v) for k, v in sorted(environ.items()) if not SECRET_NAME.search(k)}

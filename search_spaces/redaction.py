"""The one rule set that keeps secrets out of what moe-autotune records (MLflow, the Optuna storage) and prints
(error lines, excerpts of a file): orchestrator/redact.py re-exports it for the orchestrator, and
search_spaces/inputs.py's excerpts of files use it (search_spaces is the base both import; it imports neither).

A value is recorded as written only when no shape of a credential is in it. `redact_text` masks (***) every shape
it knows, wherever it sits in a string (a spec field, a tag, an error line, an environment variable's value):

- a URI's user-info (`scheme://user:password@host` -> `scheme://***@host`, also a password written unescaped with a
  quote or a space in it) and its secret-named query values;
- an HTTP authorization (`Authorization: Bearer ...`, `Basic`, `Token`, `Digest` ...; a bare `Bearer <token>`)
  and cookies (`Cookie:`, `Set-Cookie:`), in a header dump or as a JSON key;
- a secret-named key's value: `password=`, `sslpassword=` (a libpq key/value DSN), `"api_key": "..."`,
  `X-Auth-Token: ...`, quoted or not;
- tokens by their issuers' shapes (GitHub, GitLab, AWS access key ids, Slack, Hugging Face, OpenAI/Anthropic-style
  `sk-`, Stripe, Google API keys, npm, PyPI, JWTs) and PEM private keys;
- a long high-entropy value after a key-like word (`token abc123...`, `secret: ...`).

`redact_quoted` is the same rules and two more for a piece of a file quoted in an error line, where masking too
much costs nothing (a run id is worth recording, not quoting): a value after a secret word and a space (a
netrc's `login alice password hunter2`, `Basic dXNlcjpw`), and any long run of letters and digits (a key, a digest).

`redact_mapping` does the same over nested data (a spec dump, a summary) and masks the values of secret-named keys.
`redact_uri` is the older name of `redact_text` (error lines call it). The environment a run records is an
allow-list (orchestrator/tracking/environment.py), its values redacted here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

MASK = "***"
# a variable's name that may hold a secret: dropped from the recorded environment whatever group allows it
# (`PWD`, the shell's working directory, matches too: dropping it loses nothing worth a leak)
SECRET_NAME = re.compile(r"TOKEN|KEY|PASS|PWD|SECRET|CREDENTIAL|CRED|AUTH|PRIVATE|COOKIE|SIGNATURE|SESSION", re.I)
# a mapping key whose value is masked: it names a secret (contains a strong word, or ends with a weak one;
# `layout_key` and `train_tokens` are not secrets)
_STRONG_KEY = re.compile(r"password|passwd|passphrase|secret|credential|private[_\-]?key|cookie|signature", re.I)
_WEAK_KEY_END = re.compile(r"(?:token|api[_\-]?key|apikey|access[_\-]?key|pwd|pass|auth|session[_\-]?id)$", re.I)

# ---- URIs ----------------------------------------------------------------------------------------------------
# scheme:// and what follows up to whitespace or a quote (a URI inside repr() or a sentence)
_URI = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>`]*)")
# a user-info whose password holds a character that ends a URI inside a text (a space, a quote, '<', '>', a backtick:
# `http://alice:p'w d@host`, a password written unescaped): it runs to the next '@' on the same line, unless what
# follows the ':' reads as a port (`http://host:8080 and bob@x`, `http://host:8080/x and bob@x`). A password with an
# '@' before such a character cannot be told from a URI that ends at the quote and a later '@' (`'http://a:b@h' c@d`):
# the URI is taken to end there.
_ODD_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s'\"<>`:/?#@]*:(?!\d+(?:[\s'\"<>`/?#]|$))"
                           r"[^@\r\n]{0,256}?[\s'\"<>`][^@\r\n]{0,256}?@")
_QUERY_SECRET = re.compile(r"(?P<key>[?&;][^=&#;\s]*(?:token|key|pass|pwd|secret|cred|auth|signature)[^=&#;\s]*=)"
                           r"[^&#;\s]*", re.I)

# ---- the other shapes, in the order they are applied -------------------------------------------------------------
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_HEADER_END = r"[^\"'\r\n\\]+"  # a header's value runs to the end of its line or of the quoted string holding it
_QUOTE = r"(?:\\*[\"'])?"  # a quote around a JSON key or value, escaped when the JSON sits inside a JSON string
_AUTHORIZATION = re.compile(
    r"(?P<keep>\b(?:proxy-)?authorization" + _QUOTE + r"\s*[:=]\s*" + _QUOTE +
    r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|aws4-hmac-sha256|hmac|otp)\s+)?)" + _HEADER_END, re.I)
_BEARER = re.compile(r"(?P<keep>\bbearer\s+)[A-Za-z0-9\-._~+/]+=*", re.I)
_COOKIE = re.compile(r"(?P<keep>\b(?:set-)?cookie" + _QUOTE + r"\s*[:=]\s*" + _QUOTE + ")" + _HEADER_END, re.I)
_SECRET_WORDS = (r"password|passwd|passphrase|pwd|pass|secret|token|api[_\-]?key|apikey|access[_\-]?key|"
                 r"secret[_\-]?key|private[_\-]?key|credentials?|auth|session[_\-]?id|signature")
# a value: quoted (backslash escapes inside, as libpq and JSON write them), quoted with escaped quotes (JSON inside
# a JSON string), or a bare word
_VALUE = (r"'(?:[^'\\\n]|\\.)*'?|\"(?:[^\"\\\n]|\\.)*\"?|\\+[\"'].*?(?:\\+[\"']|$)"
          r"|[^\s'\",;&}\])\\]+")
# NAME=value, name: value, "name": "value", a DSN's password='a b' (the key is a word ending in a secret word)
_KEY_VALUE = re.compile(rf"(?P<keep>(?<![A-Za-z0-9])[A-Za-z0-9_.\-]*?(?:{_SECRET_WORDS})(?![A-Za-z0-9])"
                        rf"{_QUOTE}\s*(?:=|:(?!//))\s*)(?:{_VALUE})", re.I)
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|AKPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z0-9]{16}"
    r"|xox[abposrce]-[A-Za-z0-9\-]{10,}|xapp-[0-9]-[A-Za-z0-9\-]{10,}"
    r"|hf_[A-Za-z0-9]{30,}|sk-(?:proj-|ant-|live-)?[A-Za-z0-9_\-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|AIza[0-9A-Za-z_\-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_\-]{50,}"
    r"|eyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"
    r")")
# a key-like word, then (after spaces, ':' or '=') a long run that may be a key: masked when it looks random
_GENERIC = re.compile(r"(?P<keep>(?<![A-Za-z0-9])(?:token|secret|password|passwd|pwd|api[_\-]?key|apikey|"
                      r"access[_\-]?key|bearer|credentials?)[\"']?[\s:=\"']+)(?P<value>[A-Za-z0-9+/_\-.=~]{16,})", re.I)
MIN_ENTROPY_BITS = 3.0  # per character: English words and layout keys stay below, random keys above


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


def _redact_uris(text: str) -> str:
    if "://" not in text:
        return text
    text = _ODD_USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)

    def one(match: re.Match) -> str:
        rest = _QUERY_SECRET.sub(lambda m: m.group("key") + MASK, _strip_userinfo(match.group("rest")))
        return match.group("scheme") + rest

    return _URI.sub(one, text)


def _looks_random(value: str) -> bool:
    """More bits per character than words and layout keys have (a random key of 16 or more characters)."""
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= MIN_ENTROPY_BITS


def redact_text(text: Any) -> Any:
    """`text` with every credential shape this module knows masked (***); anything that is not a string as it is."""
    if not isinstance(text, str) or not text:
        return text
    text = _PEM.sub(MASK, text)
    text = _redact_uris(text)
    text = _AUTHORIZATION.sub(lambda m: m.group("keep") + MASK, text)
    text = _BEARER.sub(lambda m: m.group("keep") + MASK, text)
    text = _COOKIE.sub(lambda m: m.group("keep") + MASK, text)
    text = _KEY_VALUE.sub(lambda m: m.group("keep") + MASK, text)
    text = _TOKEN_SHAPES.sub(MASK, text)
    return _GENERIC.sub(lambda m: m.group("keep") + (MASK if _looks_random(m.group("value")) else m.group("value")),
                        text)


redact_uri = redact_text  # the name error lines have called it by


def is_secret_key(name: str) -> bool:
    """Does a mapping key name a secret (its value is masked whatever it is)?"""
    return bool(_STRONG_KEY.search(name) or _WEAK_KEY_END.search(name))


def redact_mapping(data: Any) -> Any:
    """A copy of nested dicts/lists with secret-named keys masked and every string redacted (redact_text)."""
    if isinstance(data, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                    else redact_mapping(v)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_mapping(v) for v in data]
    return redact_text(data)


def without_masked_userinfo(uri: Any) -> Any:
    """A recorded URI made usable again: `scheme://***@host` -> `scheme://host` (credentials then come from where
    the client reads them: MLFLOW_TRACKING_USERNAME/PASSWORD, PGPASSWORD or ~/.pgpass, ...)."""
    return uri.replace(f"://{MASK}@", "://") if isinstance(uri, str) else uri


# ---- quoting a file: two more shapes -------------------------------------------------------------------------------
# a word naming a secret (or a login), then a space and a value: a netrc's `login alice password hunter2`, a bare
# `Basic dXNlcjpw`, an env file's `TOKEN value`
_WORD_THEN_VALUE = re.compile(
    r"(?P<keep>[\w.\-]*(?:pass(?:word|wd|phrase)?|pwd|secret|token|key|credential|cred|auth\w*|private|cookie|"
    r"signature|session|login|bearer|basic|digest)[\w.\-]*[\"']?\s*(?:[=:]\s*|\s+))"
    r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s'\",;&}]+)", re.I)
# a long run of base64/hex with letters and digits both (a key, a digest): no word is that long
_LONG_RUN = re.compile(r"(?=[A-Za-z0-9+/=_]{32,})(?=[A-Za-z+/=_]*[0-9])(?=[0-9+/=_]*[A-Za-z])[A-Za-z0-9+/=_]{32,}")


def redact_quoted(text: str) -> str:
    """`text`, a piece of a file or of a message quoting one, with every shape redact_text knows masked and the
    two shapes of quoting too (above)."""
    text = redact_text(text)
    text = _WORD_THEN_VALUE.sub(lambda m: m.group("keep") + MASK, text)
    return _LONG_RUN.sub(MASK, text)

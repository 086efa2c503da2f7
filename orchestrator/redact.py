"""Keep secrets out of what moe-autotune records and prints: the rule set is search_spaces/redaction.py (one
home, shared with the excerpts search_spaces quotes of a file); the orchestrator imports it from here."""

from search_spaces.redaction import (
    MASK,
    SECRET_NAME,
    is_secret_key,
    redact_mapping,
    redact_quoted,
    redact_text,
    redact_uri,
    without_masked_userinfo,
)

__all__ = ["MASK", "SECRET_NAME", "is_secret_key", "redact_mapping", "redact_quoted", "redact_text", "redact_uri",
           "without_masked_userinfo"]

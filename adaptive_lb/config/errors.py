"""How a problem with a settings file is told: :class:`ConfigError`, and the safe wording
of the values in it.

A message shows what is wrong, where (the key path) and the value, short: a hostile
document (a YAML alias bomb) makes structures whose full repr would be exponentially large,
so every value goes through :func:`show`. A value that is or looks like a secret is never
shown (:func:`is_secret`), only its type.

Imports the standard library only (the bottom of the config package).
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["ConfigError", "is_secret", "show", "type_name"]


class ConfigError(ValueError):
    """An invalid configuration. ``errors`` lists every problem found, one string each,
    each naming the key path, the value and the reason."""

    def __init__(
        self, errors: list[str] | str, *, source: str | None = None, total: int | None = None
    ) -> None:
        errors = [errors] if isinstance(errors, str) else errors  # words of 100+ characters cut
        self.errors = [re.sub(r"([^\s.,:]{60})[^\s.,:]{40,}", r"\1...", e) for e in errors]
        self.source = source
        self.total = len(self.errors) if total is None else total
        """How many problems were found (``errors`` may list only the first ones)."""
        prefix = f"{source}: " if source else ""
        if len(self.errors) == 1:
            message = prefix + self.errors[0]
        else:
            message = prefix + f"{self.total} errors:\n  " + "\n  ".join(self.errors)
        super().__init__(message)


SECRET_NAME = re.compile(
    r"(?:secret|passw(?:or)?d|pwd|token|credential|cookie|auth\w*"
    r"|(?:api|access|private|client|signing|secret)[-_ ]?key)s?(?![\w-])",
    re.IGNORECASE,
)
"""A key name that is secret-like (see :func:`is_secret`)."""


def is_secret(path: str, secret_keys: Collection[str]) -> bool:
    """Whether the value at a key path is secret (no message shows it, nor keys below it):
    the path is or is under a field marked ``secret`` (``secret_keys``: header values),
    or a key on it is secret-like. A key is when, in its last 40 characters and in any case,
    secret, password, passwd, pwd, token, credential, cookie, auth + letters/digits/_
    (Authorization, OAuth) or api/access/private/client/signing/secret + key (``api_key``,
    ``apiKey``, ``X-API-Key``), plural s optional, is followed by no letter, digit, _ or -:
    the last word decides, ``token_aware``, ``password_file``, ``routing_keys`` are not."""
    under = f"{path}.".startswith(tuple(f"{key}." for key in secret_keys))
    return under or any(SECRET_NAME.search(key[-40:]) for key in path.split("."))


_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 4


def show(value: Any) -> str:
    """A short, readable rendering of a value for an error message (2.0 shows as 2)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = _repr.repr(value)  # hidden: a mapping with a secret-like key in it, say
    return "value hidden" if not isinstance(value, str) and SECRET_NAME.search(text) else text


def type_name(value: Any) -> str:
    """What a value is, in the words of a message: null, a boolean, an integer..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, bytes):
        return "binary data"
    return {int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )

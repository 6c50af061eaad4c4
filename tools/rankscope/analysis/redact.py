"""The one redactor every string passes through before it leaves rankscope.

Whatever rankscope hands to an agent may leave the host, so secrets are
scrubbed three ways:

* by name: environment variables, locals and ``--flag=value`` arguments whose
  name looks like a credential (TOKEN, KEY, SECRET, PASSWORD, ...);
* by value: the values of secret-named variables are remembered and scrubbed
  wherever else they appear (inside a "Bearer ..." string, a command line, a
  local's repr);
* in URLs: ``scheme://user:password@host`` keeps the user, loses the password,
  and query parameters named like secrets lose their values.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound=BaseModel)

MASK = "<redacted>"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|PWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|CREDENTIAL|COOKIE|SESSION_?ID|"
    r"ACCOUNT_?KEY|SHARED_?ACCESS_?(KEY|SIGNATURE)|CONNECTION_?STRING|"
    r"(^|[_-])KEY($|[_-]))",
    re.IGNORECASE,
)
# Names that match the pattern above but carry no secret.
_SAFE_NAMES = frozenset({"PWD", "OLDPWD", "KEYMAP", "XAUTHORITY", "SSH_AUTH_SOCK", "GPG_AGENT_INFO"})

# The password may hold any character but whitespace and '@' (s3://KEY:secret/with/slash@bucket).
_URL_CREDS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s'\"]+):(?P<pw>[^@\s'\"]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:[a-z0-9_-]*(?:token|secret|password|passwd|api_?key|access_?key|sig|signature|auth)[a-z0-9_-]*))=(?P<val>[^&#\s'\"]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(Bearer|Basic|Token|Digest)\s+(?P<val>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
_PROSE_AFTER_PASSWORD = frozenset(
    "is was for required prompt reset changed expired incorrect invalid wrong file protected must "
    "cannot not authentication auth and or of to from the a an with without".split()
)
_AUTH_SCHEMES = frozenset({"bearer", "basic", "token", "digest"})
"""Words that name how a credential is sent (``Authorization: Bearer X``): X is the secret, not them."""
# "password X" in prose and config dumps (``... ; password hunter2)``), whatever the value's length.
_PASSWORD_WORD = re.compile(
    r"(?P<head>\b(?:password|passwd|passphrase|pwd)\s+)(?P<val>(?!<redacted)[^\s'\";,)\]}]{4,})",
    re.IGNORECASE,
)
# Formats that are secrets wherever they appear; the mask says which kind it was.
_KNOWN_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b"),
        ("hf_token", r"\bhf_[A-Za-z0-9]{20,}\b"),
        ("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
        ("openai_key", r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
        ("aws_access_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
        ("wandb_key", r"\bwandb_[A-Za-z0-9]{20,}\b"),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),
        ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}\b"),
    )
)
# A PEM private key, whole or cut short by a repr: from BEGIN to END, or to the end of the quoted string.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[^'\"]*)", re.DOTALL
)
# 'api_key': 'VALUE' / "password": "VALUE" / 'token': b'VALUE': quoted keys in reprs and JSON, at any depth.
_QUOTED_PAIR = re.compile(
    r"(?P<q1>['\"])(?P<name>[A-Za-z_][A-Za-z0-9_.-]{0,63})(?P=q1)(?P<sep>\s*[:=]\s*)(?P<b>b?)"
    r"(?P<q2>['\"])(?P<val>(?:\\.|(?!(?P=q2)).)*)(?P=q2)"
)
# netrc: machine HOST login USER password VALUE (also 'passwd'/'account').
_NETRC = re.compile(
    r"(?P<head>\b(?:machine|default|login)\b[^\n]*?\b(?:password|passwd|account)\s+)(?P<val>[^\s'\"]+)"
)
# A long random-looking value right after a secret-ish word (wandb login KEY, "key 0123abcd...").
_NEAR_WORD = re.compile(
    r"(?P<head>\b(?:login|[a-z_]*(?:key|token|secret|passw(?:or)?d|auth|credential)s?)\b\W{1,3})(?P<val>[A-Za-z0-9+_=-][A-Za-z0-9+/_=-]{31,})",
    re.IGNORECASE,
)
# Every structural pattern below needs one of these; a string with none skips them all (most
# locals: tensors, shapes, paths, numbers), which keeps a 64-rank --locals dump cheap.
_TRIGGERS: tuple[str, ...] = (
    "://",
    "-----begin",
    "eyj",
    "_pat_",
    "hf_",
    "xox",
    "sk-",
    "akia",
    "asia",
    "wandb",
    "aiza",
    "machine",
    "login",
    "key",
    "token",
    "secret",
    "passw",
    "pwd",
    "passphrase",
    "auth",
    "credential",
    "cookie",
    "session",
    "sig",
    "bearer",
    "basic",
    "account",
    "connection",
    "gh",
)


def _may_hold_secret(text: str) -> bool:
    low = text.lower()
    return any(t in low for t in _TRIGGERS)


# ``name=value`` first, then ``name: value``: a colon pass alone would read
# "set: api_key=X" as the key "set" with the value "api_key=X".
_INLINE_ASSIGNS = tuple(
    re.compile(
        r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*"
        + sep
        + r"\s*)(?P<quote>['\"]?)(?P<val>[^\s'\",;}]+)(?P=quote)"
    )
    for sep in ("=", ":")
)


# "key" as in dictionaries and attention: key_dim, num_keys, key_padding_mask, sort_key_fn.
_KEY_NOT_SECRET = re.compile(
    r"(^|[_-])KEYS?[_-](DIM|DIMS|SIZE|LEN|LENGTH|COUNT|IDX|INDEX|NAME|NAMES|PREFIX|TYPE|FN|FUNC|COL|COLUMN|FIELD|"
    r"PADDING|MASK|PROJ|STATES?|CACHE|VALUE|MAP|LIST|ORDER)($|[_-])|^NUM[_-]KEYS?$|^(SORT|GROUP|CACHE|DICT)[_-]KEY"
)


def is_secret_name(name: str) -> bool:
    """True when a variable / argument name looks like it holds a credential."""
    bare = name.lstrip("-").upper()
    if bare in _SAFE_NAMES:
        return False
    match = _SECRET_NAME.search(bare)
    if match is None:
        return False
    if _KEY_NOT_SECRET.search(bare) and not re.search(
        r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|CREDENTIAL", bare
    ):
        return False
    return True


@dataclass
class Redactor:
    """Scrubs secrets by name, by known value and in URLs.

    Build one per answer with the environments you have seen (``learn_env``) so
    that secret values are also removed where they appear under other names.
    """

    secret_values: set[str] = field(default_factory=set)
    min_value_len: int = 6

    def learn_env(self, env: Mapping[str, str]) -> Redactor:
        for name, value in env.items():
            if is_secret_name(name) and value and len(value) >= self.min_value_len:
                self.secret_values.add(value)
        return self

    def learn_values(self, values: Iterable[str]) -> Redactor:
        for value in values:
            if value and len(value) >= self.min_value_len:
                self.secret_values.add(value)
        return self

    def text(self, text: str) -> str:
        """Redact a free-form string (a log line, a repr, a command-line word).

        Secrets are found by value (learned ones), by structure (PEM blocks, URL credentials,
        quoted keys, netrc lines, known token formats) and by name; each value masked here is
        remembered, so it is masked wherever else it shows up in the same answer.
        """
        if not text:
            return text
        for value in sorted(self.secret_values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, MASK)
        if not _may_hold_secret(text):
            return text
        text = _PEM.sub(self._keep("<redacted:private_key>"), text)
        text = _URL_CREDS.sub(lambda m: self._learned(m["pw"], f"{m['scheme']}{m['user']}:{MASK}@"), text)
        text = _QUERY_SECRET.sub(lambda m: self._learned(m["val"], f"{m['key']}={MASK}"), text)
        text = _BEARER.sub(lambda m: self._learned(m["val"], f"{m.group(1)} {MASK}"), text)
        for kind, pattern in _KNOWN_TOKENS:
            text = pattern.sub(self._keep(f"<redacted:{kind}>"), text)
        text = _QUOTED_PAIR.sub(self._quoted, text)
        text = _NETRC.sub(lambda m: self._learned(m["val"], f"{m['head']}{MASK}"), text)
        text = _PASSWORD_WORD.sub(self._password_word, text)
        text = _NEAR_WORD.sub(lambda m: self._learned(m["val"], f"{m['head']}{MASK}"), text)
        for pattern in _INLINE_ASSIGNS:
            text = pattern.sub(self._inline, text)
        return text

    def _password_word(self, m: re.Match[str]) -> str:
        if m["val"].lower() in _PROSE_AFTER_PASSWORD:  # "password required", "password prompt"
            return m.group(0)
        return self._learned(m["val"], f"{m['head']}{MASK}")

    def _learned(self, value: str, replacement: str) -> str:
        if value != MASK and len(value) >= self.min_value_len and not value.startswith("<redacted"):
            self.secret_values.add(value)
        return replacement

    def _keep(self, mask: str) -> Callable[[re.Match[str]], str]:
        def sub(m: re.Match[str]) -> str:
            return self._learned(m.group(0), mask)

        return sub

    def _quoted(self, m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]) or not m["val"] or m["val"].startswith(("<redacted", MASK)):
            return m.group(0)
        masked = f"{m['q1']}{m['name']}{m['q1']}{m['sep']}{m['q2']}{MASK}{m['q2']}"
        return self._learned(m["val"], masked)

    def _inline(self, m: re.Match[str]) -> str:
        value = m["val"]
        if value.lower() in _AUTH_SCHEMES:  # `Authorization: Bearer <redacted>`: the scheme stays
            return m.group(0)
        if is_secret_name(m["name"]) and value != MASK and not value.startswith("<redacted"):
            return self._learned(m["val"], f"{m['name']}{m['sep']}{m['quote']}{MASK}{m['quote']}")
        return m.group(0)

    def value(self, name: str, value: str) -> str:
        """Redact the value of a named thing (env var, local, argument)."""
        if is_secret_name(name) and value:
            return MASK
        return self.text(value)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Redact an environment mapping (learning its secrets first)."""
        self.learn_env(env)
        return {k: self.value(k, v) for k, v in env.items()}

    def argv(self, argv: Iterable[str]) -> list[str]:
        """Redact a command line: ``--token X``, ``--token=X`` and secrets inside words."""
        out: list[str] = []
        hide_next = False
        for word in argv:
            if hide_next:
                out.append(MASK)
                hide_next = False
                continue
            if word.startswith("-") and "=" in word:
                flag, _, val = word.partition("=")
                out.append(f"{flag}={MASK}" if is_secret_name(flag) else f"{flag}={self.text(val)}")
                continue
            if word.startswith("-") and is_secret_name(word):
                out.append(word)
                hide_next = True
                continue
            out.append(self.text(word))
        return out


@functools.cache
def _model_field_names() -> frozenset[str]:
    """Field names of rankscope's own answer models (top_level_key, missing_keys, ...): named like
    secrets by the pattern, holding none."""
    from rankscope.models.core import Model

    names: set[str] = set()
    todo: list[type[BaseModel]] = [Model]
    while todo:
        cls = todo.pop()
        names.update(cls.model_fields)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def _secret_key(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and bool(value)
        and is_secret_name(key)
        and key not in _model_field_names()
    )


def _walk(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        return redactor.text(value)
    if isinstance(value, dict):
        return {k: MASK if _secret_key(k, v) else _walk(v, redactor) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, redactor) for v in value]
    return value


def redact_model(model: ModelT, redactor: Redactor | None = None) -> ModelT:
    """Every string of an answer, redacted: the one choke point both faces pass answers through.

    The shells redact what they read (env, argv, locals) with what they know of the job; this
    pass catches any string a field carries that they did not think of (a log excerpt, a note,
    a new field) by structure, so no field can forget it. Keys named like secrets lose their
    string values.
    """
    data = model.model_dump(mode="python")
    clean = _walk(data, redactor or Redactor())
    return model if clean == data else type(model).model_validate(clean)


def redact_text(text: str, secret_values: Iterable[str] = ()) -> str:
    """Convenience: redact one string with an optional set of known secret values."""
    return Redactor().learn_values(secret_values).text(text)

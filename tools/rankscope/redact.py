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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MASK = "<redacted>"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|PWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|CREDENTIAL|COOKIE|SESSION_?ID|"
    r"(^|[_-])KEY($|[_-]))",
    re.IGNORECASE,
)
# Names that match the pattern above but carry no secret.
_SAFE_NAMES = frozenset({"PWD", "OLDPWD", "KEYMAP", "XAUTHORITY", "SSH_AUTH_SOCK", "GPG_AGENT_INFO"})

_URL_CREDS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:[a-z0-9_-]*(?:token|secret|password|passwd|api_?key|access_?key|sig|signature|auth)[a-z0-9_-]*))=(?P<val>[^&#\s'\"]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
_KNOWN_TOKENS = re.compile(
    r"\b(ghp_[A-Za-z0-9]{20,}|gho_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|"
    r"xox[baprs]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|wandb_[A-Za-z0-9]{20,})\b"
)
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


def is_secret_name(name: str) -> bool:
    """True when a variable / argument name looks like it holds a credential."""
    bare = name.lstrip("-").upper()
    if bare in _SAFE_NAMES:
        return False
    return bool(_SECRET_NAME.search(bare))


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
        """Redact a free-form string (a log line, a repr, a command-line word)."""
        if not text:
            return text
        for value in sorted(self.secret_values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, MASK)
        text = _URL_CREDS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
        text = _QUERY_SECRET.sub(lambda m: f"{m['key']}={MASK}", text)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
        text = _KNOWN_TOKENS.sub(MASK, text)
        for pattern in _INLINE_ASSIGNS:
            text = pattern.sub(self._inline, text)
        return text

    @staticmethod
    def _inline(m: re.Match[str]) -> str:
        if is_secret_name(m["name"]) and m["val"] != MASK:
            return f"{m['name']}{m['sep']}{m['quote']}{MASK}{m['quote']}"
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


def redact_text(text: str, secret_values: Iterable[str] = ()) -> str:
    """Convenience: redact one string with an optional set of known secret values."""
    return Redactor().learn_values(secret_values).text(text)

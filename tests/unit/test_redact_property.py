"""Random secrets embedded in random reprs never survive the redactor."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.analysis.redact import Redactor

SECRET_NAMES = (
    "api_key",
    "password",
    "hf_token",
    "secret",
    "AWS_SECRET_ACCESS_KEY",
    "auth_token",
    "private_key",
)
secrets = st.text(
    alphabet="abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=12, max_size=48
)
names = st.sampled_from(SECRET_NAMES)
noise = st.dictionaries(
    st.sampled_from(("lr", "step", "path", "model", "shape")),
    st.one_of(
        st.integers(0, 10_000), st.floats(0, 1, allow_nan=False), st.sampled_from(("llama", "/data/x"))
    ),
    max_size=3,
)


def _shapes(name: str, secret: str, other: dict[str, object]) -> list[str]:
    nested = {"config": {**other, name: secret}}
    return [
        repr(nested),
        json.dumps(nested),
        f"Namespace({name}={secret!r}, lr=0.1)",
        f"{name}={secret}",
        f"{name}: {secret}",
        f"https://user:{secret}@host.example.com/path",
        f"machine host login user password {secret}",
        repr({name: secret.encode()}),
    ]


@settings(max_examples=60, deadline=None)
@given(name=names, secret=secrets, other=noise)
def test_random_secrets_in_random_reprs_never_survive(
    name: str, secret: str, other: dict[str, object]
) -> None:
    for text in _shapes(name, secret, other):
        assert secret not in Redactor().text(text), text

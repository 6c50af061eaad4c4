"""The redactor: by name, by value, in URLs, in command lines."""

from __future__ import annotations

from rankscope.redact import MASK, Redactor, is_secret_name, redact_text


def test_secret_names() -> None:
    for name in (
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "--auth-token",
        "api_key",
        "KEY",
    ):
        assert is_secret_name(name), name
    for name in (
        "PWD",
        "RANK",
        "MASTER_ADDR",
        "NCCL_DEBUG",
        "KEYMAP",
        "MONKEY_COUNT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    ):
        assert not is_secret_name(name), name


def test_env_values_scrubbed_everywhere() -> None:
    r = Redactor()
    env = r.env({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz", "MY_SECRET": "s3cr3t-value", "RANK": "3"})
    assert env == {"HF_TOKEN": MASK, "MY_SECRET": MASK, "RANK": "3"}
    # the learned value is scrubbed where it appears under another name
    assert "s3cr3t-value" not in r.text("header = 'Bearer x' + 's3cr3t-value'")
    assert r.value("auth_header", "Bearer abcdefghijklmnop") == MASK
    assert "abcdefghijklmnop" not in r.text("curl -H 'Authorization: Bearer abcdefghijklmnop'")


def test_urls() -> None:
    out = redact_text("s3 at https://alice:pa55word@storage.example.com/bucket?sig=deadbeef123&x=1")
    assert "pa55word" not in out and "deadbeef123" not in out
    assert "alice" in out and "x=1" in out


def test_argv() -> None:
    r = Redactor()
    argv = r.argv(
        ["train.py", "--token", "abc123456", "--lr=0.1", "--password=hunter22", "--wandb-key", "k" * 12]
    )
    assert argv == ["train.py", "--token", MASK, "--lr=0.1", f"--password={MASK}", "--wandb-key", MASK]


def test_inline_assignments_and_known_tokens() -> None:
    out = redact_text("os.environ['X'] set: api_key=abcd1234efgh ghp_" + "a" * 36 + " lr=0.1")
    assert "abcd1234efgh" not in out and "ghp_" not in out and "lr=0.1" in out

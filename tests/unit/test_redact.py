"""The redactor: by name, by value, in URLs, in command lines."""

from __future__ import annotations

import pytest

from rankscope.analysis.redact import MASK, Redactor, is_secret_name, redact_text


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


# -- secrets by structure: the shapes real training code carries -----------------------------------

PLANTED: tuple[tuple[str, str], ...] = (
    # (text, the secret fragment that must not survive)
    ("{'wandb': {'project': 'p', 'api_key': 'f00dbabe0123456789abcdef'}}", "f00dbabe0123456789abcdef"),
    ('{"password": "pa55-w0rd-json", "user": "bob"}', "pa55-w0rd-json"),
    ("{'token': b'rawbytes-secret-1234'}", "rawbytes-secret-1234"),
    ("machine api.wandb.ai login user password ZZTOPSECRET99", "ZZTOPSECRET99"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA1234",
    ),
    ("'-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAA...'", "b3BlbnNzaC1rZXktdjEAAAA"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N",
    ),
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCY@bucket/x", "K7MDENG/bPxRfiCY"),
    (
        "AccountName=a;AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA==;EndpointSuffix=core.windows.net",
        "Zm9vYmFyYmF6cXV4",
    ),
    ("https://acct.blob.core.windows.net/c?sv=2022&sig=AbCdEf0123456789%2Bsig", "AbCdEf0123456789"),
    ("secret_key = hunter2hunter2", "hunter2hunter2"),
    ("token: ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnop"),
    ("OPENAI=sk-proj-abcdefghijklmnopqrstuvwxyz012345", "sk-proj-abcdefghijkl"),
    ("xoxb-123456789012-abcdefghijkl", "xoxb-123456789012"),
    ("wandb login 0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234567"),
    (
        '{"type": "service_account", "private_key_id": "0a1b2c3d4e5f60718293", "client_email": "x"}',
        "0a1b2c3d4e5f",
    ),
)


def test_planted_secrets_never_survive() -> None:
    for text, fragment in PLANTED:
        out = Redactor().text(text)
        assert fragment not in out, (text, out)


def test_masks_keep_the_shape_that_helps() -> None:
    r = Redactor()
    assert r.text("hf_token='hf_abcdefghijklmnopqrstuvwx'") == "hf_token='<redacted:hf_token>'"
    assert r.text("postgres://bob:s3cr3t/with@db.example.com/x") == f"postgres://bob:{MASK}@db.example.com/x"
    assert r.text("{'api_key': 'abcdef123456'}") == f"{{'api_key': '{MASK}'}}"


def test_a_secret_found_once_is_scrubbed_everywhere_after() -> None:
    r = Redactor()
    r.text("{'password': 'only-in-a-dict-9'}")
    assert "only-in-a-dict-9" not in r.text("connecting with only-in-a-dict-9 as the password")


def test_ordinary_locals_pass_unchanged() -> None:
    r = Redactor()
    for text in (
        "tensor([[0.1000, 0.2000]], device='cuda:0', grad_fn=<AddBackward0>)",
        "torch.Size([4, 1024])",
        "{'lr': 0.001, 'batch_size': 32, 'step': 10, 'keys': ['a', 'b']}",
        "'/data/shards/train-00012-of-00128.parquet'",
        "http://10.0.0.1:29500/path",
        "Namespace(model='llama', max_steps=1000, key_dim=64)",
        "<Linear(in_features=1024, out_features=1024, bias=True) at 0x7f00>",
    ):
        assert r.text(text) == text, text


def test_redact_model_walks_every_string_of_an_answer() -> None:
    from rankscope.analysis.redact import redact_model
    from rankscope.models.core import Frame, Job, LocalVar, RankStack, StacksReport, ThreadStack, Verdict

    secret = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    frame = Frame(
        function="main",
        file="/job/train.py",
        line=3,
        locals=[LocalVar(name="cfg", repr=f"{{'wandb': {{'api_key': 'k3y-{secret}'}}}}")],
    )
    report = StacksReport(
        job=Job(job_id="j", notes=[f"note with token: {secret}"]),
        stacks=[RankStack(rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, frames=[frame])])],
        verdict=Verdict(kind="no_collective", summary="s", evidence=[f"https://u:{secret}@h/x"]),
    )
    clean = redact_model(report)
    assert secret not in clean.model_dump_json()
    assert clean.stacks[0].threads[0].frames[0].function == "main"
    untouched = StacksReport(job=Job(job_id="j"), verdict=Verdict(kind="no_collective", summary="s"))
    assert redact_model(untouched) is untouched


def test_an_auth_scheme_stays_and_its_credential_goes_everywhere() -> None:
    from rankscope.analysis.redact import Redactor

    r = Redactor()
    jwt = "eyJhbGciOiJIUzI1NiJ9.vzi1JYY4U9QF3MpeUGeK.sZqGuzN8XTyXZjdURlSD"  # payload not JSON-shaped
    assert r.text(f"curl -H 'Authorization: Bearer {jwt}'") == "curl -H 'Authorization: Bearer <redacted>'"
    assert r.text(f"Authorization: Basic {jwt[:20]}") == "Authorization: Basic <redacted>"
    assert r.text(f"retrying with {jwt}") == "retrying with <redacted>"  # learned in this answer
    assert "Bearer" in r.text("Authorization: Bearer")  # the word alone is not a secret


def test_password_followed_by_its_value_in_prose() -> None:
    from rankscope.analysis.redact import redact_text

    assert redact_text("failed (peer [::1]:29500; password 8s0iMRZEYpP0YYPpkF)") == (
        "failed (peer [::1]:29500; password <redacted>)"
    )
    assert redact_text("PASSWD hunter22") == "PASSWD <redacted>"
    assert redact_text("password required for user bob") == "password required for user bob"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2Rl=;"
            "EndpointSuffix=core.windows.net",
            "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2Rl",
        ),
        (
            "https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sp=r&se=2026-12-01&sig=AbCdEf0123456789abcdefGHIJ%2Bq",
            "AbCdEf0123456789abcdefGHIJ",
        ),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;"
            "SharedAccessKey=QWxhZGRpbjpvcGVuIHNlc2FtZQ0123456789abcdefgh=",
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ0123456789",
        ),
        (
            '{"type": "service_account", "private_key_id": "0123456789abcdef0123456789abcdef01234567", '
            '"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n"}',
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
        ),
        ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "1234567890abcdefghijklmnopqrstuv"),
    ],
)
def test_cloud_credentials_azure_and_gcp(text: str, secret: str) -> None:
    from rankscope.analysis.redact import redact_text

    out = redact_text(text)
    assert secret not in out and "<redacted" in out

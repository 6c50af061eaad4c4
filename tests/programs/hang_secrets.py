"""A 2-rank hang whose locals, argv, environment and log carry credentials in the shapes real jobs do.

Rank 1 waits in barrier, rank 0 in all_reduce. ``main``'s locals hold every planted secret; the
values come from the environment (RANKSCOPE_PLANTED_*), so the test that plants them knows them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


@dataclass
class HubConfig:
    repo: str
    token: str


def planted(name: str) -> str:
    return os.environ[f"RANKSCOPE_PLANTED_{name}"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-token")
    parser.add_argument("--db-url")
    parser.add_argument("--trace-path")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    cfg = {"wandb": {"project": "llm", "api_key": planted("WANDB")}, "lr": 0.1}
    hub = HubConfig(repo="org/model", token=planted("HF"))
    ns = argparse.Namespace(hf_token=planted("HF"), steps=10)
    blob = json.dumps({"type": "service_account", "private_key": planted("PEM"), "client_email": "x@y.iam"})
    raw = f"password={planted('BYTES')}".encode()
    netrc = f"machine api.example.com login me password {planted('NETRC')}"
    url = f"s3://{planted('AWS_ID')}:{planted('AWS_SECRET')}@bucket/path"
    headers = {"Authorization": f"Bearer {planted('JWT')}"}
    tokens = [planted("GITHUB"), planted("OPENAI"), planted("SLACK"), planted("JWT")]
    pem = planted("PEM")
    encoded = base64.b64encode(b"not a secret").decode()
    step = 3
    if args.trace_path:
        with open(f"{args.trace_path}.rank{rank}", "w") as log:
            log.write(f"[rank{rank}]: connecting with Authorization: Bearer {planted('JWT')}\n")
            log.write(f"[rank{rank}]: wandb api_key={planted('WANDB')} url={url}\n")
            log.write(f"[rank{rank}]: RuntimeError: failed to load {netrc}\n")
            log.write(
                f"[rank{rank}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
                f"by peer [127.0.0.1]:29500 (Authorization: Bearer {planted('JWT')}; api_key={planted('WANDB')}; "
                f"{url}; password {planted('NETRC')})\n"
            )
    mark_ready(f"rank{rank}")
    t = torch.ones(4)
    if rank == 1:
        dist.barrier()
    dist.all_reduce(t)
    del cfg, hub, ns, blob, raw, headers, tokens, pem, encoded, step
    sys.exit(0)


if __name__ == "__main__":
    main()

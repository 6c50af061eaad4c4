"""Set up one incident of the agent benchmark and print what to hand the agent.

    python benchmarks/agent/setup_incident.py list
    python benchmarks/agent/setup_incident.py start NAME --arm rankscope|shell [--workdir DIR]
    python benchmarks/agent/setup_incident.py stop --workdir DIR

``start`` copies a dead job's leftovers into DIR, or starts a live job there (torchrun, gloo, CPU),
or, for a multi-node incident, brings its nodes up and starts its jobs over them (multinode.py),
then prints the prompt for the chosen arm: the incident's description and the tools of that arm,
nothing else (never the truth, never this repository). See PROTOCOL.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from incidents import all_incidents, by_name, set_up, stop

SKILL_MD = Path(__file__).resolve().parents[2] / "SKILL.md"


def skill_listing() -> str:
    """The skill as a harness lists it to the model before any read: its name and description
    (the frontmatter); the body, SKILL.md, is read when the agent chooses to."""
    front = SKILL_MD.read_text(encoding="utf-8").split("---", 2)[1]
    fields = dict(
        line.split(": ", 1) for line in front.splitlines() if ": " in line and not line[0].isspace()
    )
    return f"{fields['name']}: {fields['description']}"


ARMS = {
    "rankscope": (
        "You have rankscope on this host: its skill is installed, and its CLI (`rankscope --help`) and MCP "
        "server are available. Your harness lists the skill as follows; its SKILL.md says how to use it.\n"
        "  " + skill_listing()
    ),
    "shell": (
        "You have a shell on this host with Python, the job's Python environment and py-spy "
        "(`py-spy dump --pid PID`, add `--locals` or `--native` as needed). rankscope is not available."
    ),
}
FOOTER = (
    "When you are done, answer with: hung or not, the responsible rank(s), the cause, the fix. "
    "Count nothing yourself; the person running this benchmark counts your steps and the bytes you read."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    start = sub.add_parser("start")
    start.add_argument("name")
    start.add_argument("--arm", choices=sorted(ARMS), required=True)
    start.add_argument("--workdir", type=Path, default=None)
    end = sub.add_parser("stop")
    end.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for incident in all_incidents():
            print(f"{incident.name}\t{'live' if incident.live else 'dead'}")
        return 0
    if args.cmd == "stop":
        stop(args.workdir.resolve())
        return 0
    incident = by_name(args.name)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="incident-"))).resolve()
    pid = set_up(incident, workdir)
    print(
        f"# set up {incident.name} in {workdir}" + (f" (launcher pid {pid})" if pid else ""), file=sys.stderr
    )
    if incident.multinode:
        from multinode import state_dir

        state = state_dir(workdir)
        print(
            f"# run every command of the agent as: AGENT_WRAP={state / 'login'} "
            f"ARM_PATH={state / ('arm-' + args.arm)} {Path(__file__).parent / 'agentrun.sh'} TRANSCRIPT 'CMD'",
            file=sys.stderr,
        )
    print(f"# when done: python {Path(__file__).name} stop --workdir {workdir}", file=sys.stderr)
    print(incident.description(workdir).rstrip())
    print()
    print(ARMS[args.arm])
    print(FOOTER)
    return 0


if __name__ == "__main__":
    sys.exit(main())

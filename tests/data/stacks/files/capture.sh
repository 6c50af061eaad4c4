#!/usr/bin/env bash
# Capture saved stacks of a real hung gloo job, as incidents arrive when the job is gone:
# py-spy text and JSON dumps (one file per rank, with and without --native) and a torchrun
# log holding every rank's faulthandler output under its [defaultN]: prefix.
# Run from the repository root: bash tests/data/stacks/files/capture.sh
set -euo pipefail
out=tests/data/stacks/files
py=.venv/bin/python
ready=$(mktemp -d)
RANKSCOPE_TEST_READY=$ready timeout 120 .venv/bin/torchrun --nproc_per_node=3 --master_port=29883 \
  tests/programs/hang_collectives.py --mode mismatch --odd 2 >/dev/null 2>&1 &
launcher=$!
for _ in $(seq 120); do [ "$(ls "$ready" | wc -l)" -ge 3 ] && break; sleep 1; done
sleep 2
i=0
for pid in $(pgrep -f "hang_collectives.py --mode mismatch" | sort -n); do
  [ "$(cat /proc/$pid/comm)" = "torchrun" ] && continue
  rank=$(tr '\0' '\n' < /proc/$pid/environ | sed -n 's/^RANK=//p')
  [ -z "$rank" ] && continue
  .venv/bin/py-spy dump --pid "$pid" > "$out/pyspy_text/rank$rank.txt"
  .venv/bin/py-spy dump --json --pid "$pid" > "$out/pyspy_json/stacks_rank_$rank.json"
  .venv/bin/py-spy dump --native --pid "$pid" > "$out/pyspy_native_text/rank-$rank.txt"
  i=$((i+1))
done
kill -TERM -- "$launcher" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
cat > "$ready/fh.py" <<'PY'
import faulthandler, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
faulthandler.dump_traceback_later(6, exit=False)
def helper():
    dist.barrier()
for step in range(5):
    t = torch.ones(2)
    if r == 1 and step == 2:
        helper()
    else:
        dist.all_reduce(t)
PY
timeout 20 .venv/bin/torchrun --nproc_per_node=3 --master_port=29884 --tee 3 --log-dir "$ready/logs" \
  "$ready/fh.py" > "$out/faulthandler_torchrun.log" 2>&1 || true
sed -i "s#$ready#/job#g" "$out/faulthandler_torchrun.log"
rm -rf "$ready"
echo "captured $i ranks"

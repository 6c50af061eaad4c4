#!/usr/bin/env bash
# Capture py-spy dumps with --locals (text and JSON, one file per rank) of the subgroup hang of
# tests/programs/hang_subgroup.py --groups table: rank 3 skipped its pair's all_reduce and waits in
# the world barrier, rank 2 is left in the pair's all_reduce; every rank's `pairs` local holds its
# ProcessGroup and NON_GROUP_MEMBER (-100) for the other pair.
# Run from the repository root: bash tests/data/stacks/files/capture_subgroup.sh
set -euo pipefail
out=tests/data/stacks/files
ready=$(mktemp -d)
(cd tests/programs && RANKSCOPE_TEST_READY=$ready timeout 120 ../../.venv/bin/torchrun --nproc_per_node=4 \
  --master_port=29884 hang_subgroup.py --groups table >/dev/null 2>&1) &
launcher=$!
for _ in $(seq 120); do [ "$(ls "$ready" | wc -l)" -ge 4 ] && break; sleep 1; done
sleep 2
for pid in $(pgrep -f "hang_subgroup.py --groups table" | sort -n); do
  [ "$(cat /proc/$pid/comm)" = "torchrun" ] && continue
  rank=$(tr '\0' '\n' < /proc/$pid/environ | sed -n 's/^RANK=//p')
  [ -z "$rank" ] && continue
  .venv/bin/py-spy dump --locals --pid "$pid" > "$out/subgroup_locals_text/rank$rank.txt"
  .venv/bin/py-spy dump --locals --json --pid "$pid" > "$out/subgroup_locals_json/rank_$rank.json"
done
kill -TERM -- "$launcher" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
rm -rf "$ready"

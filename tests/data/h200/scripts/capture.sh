#!/bin/bash
# capture.sh DIR PID...: what a watch would take at a stall, raw, beside rankscope's own look.
# Each rank: py-spy dumps (native JSON, locals text), /proc facts; then rankscope's look and verdict.
d=$1; shift; mkdir -p "$d"; date +%s.%N > "$d/t_start"
for pid in "$@"; do
  r=$(tr '\0' '\n' < /proc/$pid/environ | sed -n 's/^RANK=//p'); r=${r:-p$pid}
  ( timeout 25 py-spy dump --json --native --pid $pid > "$d/pyspy_native_rank$r.json" 2> "$d/pyspy_native_rank$r.err" ) &
  cat /proc/$pid/stat > "$d/stat_rank$r.txt" 2>/dev/null
  { cat /proc/$pid/wchan; echo; cat /proc/$pid/syscall; } > "$d/wait_rank$r.txt" 2>/dev/null
  for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) $(cat $t/wchan 2>/dev/null)"; done > "$d/threads_rank$r.txt"
  ls -l /proc/$pid/fd > "$d/fds_rank$r.txt" 2>/dev/null
  tr '\0' '\n' < /proc/$pid/cmdline > "$d/cmdline_rank$r.txt"
  tr '\0' '\n' < /proc/$pid/environ | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_|TORCHELASTIC|NCCL|TORCH_|GROUP_RANK|LOCAL_WORLD)' > "$d/env_rank$r.txt"
done
wait
for pid in "$@"; do
  r=$(tr '\0' '\n' < /proc/$pid/environ | sed -n 's/^RANK=//p'); r=${r:-p$pid}
  ( timeout 25 py-spy dump --locals --pid $pid > "$d/pyspy_locals_rank$r.txt" 2>&1 ) &
  cat /proc/$pid/stat > "$d/stat2_rank$r.txt" 2>/dev/null
done
wait
date +%s.%N > "$d/t_raw_done"

#!/bin/bash
# What rankscope's window reads, saved raw for replay: for each rank pid, /proc stat, a py-spy dump with locals,
# a 1 s py-spy record (raw, threads, idle, nonblocking), another dump with locals, stat again.
# usage: window.sh OUTDIR PID...
out=$1; shift; mkdir -p $out
for p in "$@"; do cut -d' ' -f14,15 /proc/$p/stat > $out/stat0_$p.txt; py-spy dump --json --locals --pid $p > $out/look0_$p.json 2>/dev/null & done; wait
date +%s.%N > $out/t0.txt
for p in "$@"; do py-spy record --pid $p --format raw --output $out/record_$p.txt --threads --idle --nonblocking --full-filenames --rate 50 --duration 1 >/dev/null 2>&1 & done; wait
for p in "$@"; do py-spy dump --json --locals --pid $p > $out/look1_$p.json 2>/dev/null & done; wait
for p in "$@"; do cut -d' ' -f14,15 /proc/$p/stat > $out/stat1_$p.txt; done
date +%s.%N > $out/t1.txt

#!/bin/bash
# rs.sh DIR NAME ARGS...: one rankscope call, its output, stderr and time kept.
d=$1; n=$2; shift 2; s=$(date +%s.%N)
timeout 40 python3 -m rankscope "$@" > "$d/$n.json" 2> "$d/$n.err"; echo "rc=$? start=$s end=$(date +%s.%N)" > "$d/$n.rc"

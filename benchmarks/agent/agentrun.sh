#!/bin/bash
# One step of an agent arm: run a command, print its output, and log both to a transcript.
#
#   agentrun.sh TRANSCRIPT 'command'
#
# The agent runs every command (file reads included) through it; count.py then reads the
# transcript: steps are commands, bytes are the bytes of their output. ARM_PATH, when set, is
# the PATH the command sees (a folder holding only that arm's tools, e.g. rankscope and py-spy
# for the rankscope arm, py-spy alone for the shell arm). AGENT_WRAP, when set, is a program the
# command runs under (a multi-node incident's `login`: the command runs as on a login node).
t=$1; shift
n=$(( $(grep -c '^### step ' "$t" 2>/dev/null || echo 0) + 1 ))
export PATH="${ARM_PATH:+$ARM_PATH:}/usr/local/bin:/usr/bin:/bin"
out=$(cd "$(dirname "$t")" && timeout 600 ${AGENT_WRAP:+"$AGENT_WRAP"} bash -c "$*" 2>&1)
printf '### step %d: %s\n%s\n' "$n" "$*" "$out" >> "$t"
printf '%s\n' "$out"

#!/bin/bash
# On the GPU machine: the 8-rank DDP job with one rank a batch short, on NCCL (8 ranks on one GPU, rank.sh).
# Saved: every rank's plain py-spy dump, rankscope's live answers, then (after the 60 s watchdog) the log,
# the recorder dumps and rankscope's post-mortem on them.
set -u
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
C=/tmp/uneven; mkdir -p $C/fr
export TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE=$C/fr/rank_ TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$C/fr/rank_ TORCH_NCCL_ENABLE_TIMING=1 PG_TIMEOUT=60
python3 -c "import torch;print(torch.__version__, torch.cuda.nccl.version())" > $C/versions.txt; py-spy --version >> $C/versions.txt
cp $R/.gpu/ddp_uneven_nccl.py $C/train.py
cd $C && setsid python3 -m torch.distributed.run --nproc_per_node=8 --master_port=29711 --no-python bash $R/.gpu/rank.sh train.py > $C/torchrun.log 2>&1 &
L=$!
cd $R
deadline=$((SECONDS+150))
while [ $(grep -c "epoch 0 step 0" $C/torchrun.log) -lt 8 ] && [ $SECONDS -lt $deadline ]; do sleep 1; done
echo "started: $(grep -c 'epoch 0 step 0' $C/torchrun.log) ranks at ${SECONDS}s"; t_start=$SECONDS
sleep 15
pids=$(pgrep -f "python3 train.py$" | tr '\n' ' '); echo "launcher $L ranks $pids"
for p in $pids; do echo "== $p $(tr '\0' '\n' < /proc/$p/environ | grep -E '^RANK=')"; timeout 20 py-spy dump --pid $p; done > $C/pyspy_plain.txt 2>&1
for p in $pids; do cut -d' ' -f3,14,15 /proc/$p/stat; done > $C/stat.txt
s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid $L --brief > $C/stacks_brief.txt 2>&1; echo "stacks brief rc=$? $((SECONDS-s))s"
s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid $L --json --full > $C/stacks_full.json 2> $C/stacks_full.err; echo "stacks full rc=$? $((SECONDS-s))s"
s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid $L --native --brief > $C/stacks_native_brief.txt 2>&1; echo "stacks native rc=$? $((SECONDS-s))s"
head -c 3000 $C/stacks_brief.txt
(cd /tmp && tar czf $OUT/live.tgz uneven)
deadline=$((SECONDS+150))
while kill -0 $L 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 2; done
echo "launcher gone: $(kill -0 $L 2>/dev/null && echo no || echo yes) at ${SECONDS}s; dumps: $(ls $C/fr | wc -l)"
kill -KILL -- -$L 2>/dev/null
timeout 60 python3 -m rankscope triage --brief $C > $C/triage_brief.txt 2>&1; echo "triage rc=$?"
timeout 60 python3 -m rankscope triage --json --full $C > $C/triage_full.json 2>&1
timeout 60 python3 -m rankscope fr --brief $C/fr > $C/fr_brief.txt 2>&1
head -c 3000 $C/triage_brief.txt; echo; head -c 1500 $C/fr_brief.txt
cd /tmp && tar czf $OUT/uneven.tgz uneven && ls -la $OUT

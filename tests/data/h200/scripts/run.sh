#!/bin/bash
# The device checks, in one go. OUT gets one tarball. Set BACKEND=gloo to rehearse on CPU.
G=$(cd "$(dirname "$0")" && pwd); R=${OUT:-/tmp/out}/cap; rm -rf "$R"; mkdir -p "$R"
export BACKEND=${BACKEND:-nccl} PYTHONUNBUFFERED=1
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
{ python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.nccl.version())"; py-spy --version; nvidia-smi -L; uname -a; } > "$R/versions.txt" 2>&1
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
ranks_of() { pgrep -P "$1" | while read p; do if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q '^RANK='; then echo $p; fi; done; }

# --- W: a rank stalls in a data read; the job's 30 s timeout ends it; torchrun restarts once ---
W=$R/watch_stall; mkdir -p $W/fr; export OUTDIR=$W
for r in 0 1 2 3; do mkfifo $W/shard-$r; done
( cd $G && TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$W/fr/nccl_trace_rank_ \
  setsid timeout 200 python3 -m torch.distributed.run --nproc_per_node=4 --max-restarts=1 --monitor-interval=1 \
  --no-python bash rank.sh w_stall.py > $W/torchrun.log 2>&1 ) &
WP=$!
for a in 1 2; do
  for i in $(seq 1 120); do [ "$(lines $W/stall_started)" -ge $a ] && break; sleep 0.5; done
  t0=$(date +%s.%N); sleep 3
  TR=$(pgrep -f '^python3 -m torch.distributed.run --nproc_per_node=4' | head -1)
  PIDS=$(ranks_of $TR | tr '\n' ' ')
  echo "attempt $a stall_seen=$t0 torchrun=$TR ranks=$PIDS" >> $W/timeline.txt
  mkdir -p $W/a$a; bash $G/rs.sh $W/a$a look stacks --local --json --pid $TR
  bash $G/capture.sh $W/a$a $PIDS
  bash $G/rs.sh $W/a$a stacks stacks --json --pid $TR
  echo "attempt $a captured_end=$(date +%s.%N)" >> $W/timeline.txt
done
wait $WP; echo "torchrun rc=$? ended=$(date +%s.%N)" >> $W/timeline.txt
ls -la $W/fr >> $W/timeline.txt

# --- I: static rendezvous, WORLD_SIZE=4, rank 3 never starts ---
for MODE in lazy eager; do
  I=$R/init_$MODE; mkdir -p $I; PORT=$((29600 + RANDOM % 300))
  ( cd $G; for r in 0 1 2; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT MODE=$MODE NCCL_HOSTID=node$r \
      setsid timeout 60 python3 i_init.py > $I/rank$r.log 2>&1 & echo $! >> $I/pids; done )
  sleep 14
  PIDS=$(for p in $(cat $I/pids); do pgrep -P $p; done | tr '\n' ' ')
  bash $G/capture.sh $I $PIDS
  bash $G/rs.sh $I ps ps --json
  bash $G/rs.sh $I stacks stacks --json --pid $(echo $PIDS | cut -d' ' -f1)
  ss -ltnp > $I/listen.txt 2>&1
  for p in $(cat $I/pids); do kill -- -$p 2>/dev/null; done; sleep 1
done

# --- O: OOM with memory snapshots, the eval outputs kept with their graph ---
if [ "$BACKEND" = nccl ]; then
  O=$R/oom_eval_kept; mkdir -p $O; cp $G/../oom_eval_kept/*.py $O/
  ( cd $O && OUTDIR=$O timeout 150 python3 train.py > $O/train.log 2>&1; echo "rc=$?" >> $O/train.log )
  bash $G/rs.sh $O triage triage --json $O
  rm -f $O/*.pyc; rm -rf $O/__pycache__
fi
cp -r $G $R/scripts 2>/dev/null; rm -rf $R/scripts/__pycache__
find $R -type p -delete
mkdir -p ${OUT:-/tmp/out}/oom; [ -d $R/oom_eval_kept ] && mv $R/oom_eval_kept ${OUT:-/tmp/out}/oom/ && tar -C ${OUT:-/tmp/out}/oom -czf ${OUT:-/tmp/out}/cap_oom.tgz oom_eval_kept && rm -rf ${OUT:-/tmp/out}/oom
tar -C ${OUT:-/tmp/out} -czf ${OUT:-/tmp/out}/cap.tgz cap && rm -rf $R
ls -la ${OUT:-/tmp/out}

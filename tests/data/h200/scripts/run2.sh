#!/bin/bash
# The watch on a real NCCL job: started beside it before the stall, read the morning after.
G=$(cd "$(dirname "$0")" && pwd); R=${OUT:-/tmp/out}/cap2; rm -rf "$R"; mkdir -p "$R"
export BACKEND=${BACKEND:-nccl} PYTHONUNBUFFERED=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
W=$R/job; mkdir -p $W; export OUTDIR=$W
for r in 0 1 2 3; do mkfifo $W/shard-$r; done
cp $G/w_stall.py $G/rank.sh $W/
( cd $W && setsid timeout 240 python3 -m torch.distributed.run --nproc_per_node=4 --max-restarts=1 --monitor-interval=1 \
  --no-python bash rank.sh w_stall.py > $W/torchrun.log 2>&1 ) &
WP=$!
for i in $(seq 1 60); do TR=$(pgrep -f '^python3 -m torch.distributed.run --nproc_per_node=4' | head -1); [ -n "$TR" ] && [ -n "$(pgrep -P $TR)" ] && break; sleep 0.5; done
sleep 2
echo "watch start $(date +%s.%N) torchrun=$TR" >> $R/timeline.txt
( cd $W && timeout 300 python3 -m rankscope watch --pid $TR --out $R/watch --detach > $R/watch_start.txt 2>&1 )
wait $WP; echo "torchrun rc=$? ended=$(date +%s.%N)" >> $R/timeline.txt
for i in $(seq 1 40); do grep -q '"state": *"\(job_ended\|stopped\|failed\)"' $R/watch/watch.json 2>/dev/null && break; sleep 0.5; done
cat $W/stall_started >> $R/timeline.txt
( cd $W && timeout 120 python3 -m rankscope triage --brief $R/watch > $R/triage_watch.txt 2>&1; echo "rc=$?" >> $R/triage_watch.txt )
( cd $W && timeout 120 python3 -m rankscope triage --json $R/watch > $R/triage_watch.json 2>&1 )
( cd $W && timeout 120 python3 -m rankscope triage --brief $W/torchrun.log > $R/triage_log.txt 2>&1 )
find $R -type p -delete
tar -C ${OUT:-/tmp/out} -czf ${OUT:-/tmp/out}/cap2.tgz cap2 && rm -rf $R
ls -la ${OUT:-/tmp/out}

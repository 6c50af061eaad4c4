#!/bin/bash
# On the GPU machine: 6 NCCL jobs of 4 ranks on one GPU, then per job the raw window and rankscope's answers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
C=/tmp/cap; mkdir -p $C
python3 -c "import torch;print(torch.__version__, torch.cuda.nccl.version())" > $C/versions.txt; py-spy --version >> $C/versions.txt
port=29600; declare -A L
for m in healthy straggler busy gpueval lone skipstep; do
  port=$((port+7)); mkdir -p $C/$m/ready
  READY=$C/$m/ready setsid python3 -m torch.distributed.run --nproc_per_node=4 --master_port=$port --no-python bash /workspace/rank.sh /workspace/jobs.py --mode $m > $C/$m/torchrun.log 2>&1 &
  L[$m]=$!
done
deadline=$((SECONDS+200))
for m in healthy straggler busy gpueval lone skipstep; do
  while [ $(ls $C/$m/ready | wc -l) -lt 4 ] && [ $SECONDS -lt $deadline ]; do sleep 1; done
  echo "$m ready: $(ls $C/$m/ready | wc -l) at ${SECONDS}s"
done
sleep 5
for m in healthy straggler busy gpueval lone skipstep; do

  pids=$(pgrep -f "python3 /workspace/jobs.py --mode $m$" | tr '\n' ' ')
  echo "$m launcher ${L[$m]} ranks: $pids"
  timeout 30 bash window.sh $C/$m/window $pids
  for r in $pids; do tr '\0' '\n' < /proc/$r/environ | grep -E '^(RANK|LOCAL_RANK)=' | tr '\n' ' ' > $C/$m/window/env_$r.txt; done
  s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid ${L[$m]} --json --full > $C/$m/stacks.json 2> $C/$m/stacks.err; echo "$m stacks rc=$? $((SECONDS-s))s"
  s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid ${L[$m]} > $C/$m/stacks.txt 2>&1; echo "$m stacks text $((SECONDS-s))s"
  s=$SECONDS; timeout 90 python3 -m rankscope stacks --pid ${L[$m]} --window 0 --json --full > $C/$m/stacks_w0.json 2>&1; echo "$m stacks w0 $((SECONDS-s))s"
  python3 - $C/$m/stacks.json <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1])); v=d["verdict"]; print("  ", v["kind"], v["suspect_ranks"], v["confidence"], "|", v["summary"][:300]); print("   progress:", (d.get("progress") or {}).get("summary"))
except Exception as e: print("  bad json", e)
PY
done
for m in healthy straggler busy gpueval lone skipstep; do kill -TERM -- -${L[$m]} 2>/dev/null; done
sleep 2
for m in healthy straggler busy gpueval lone skipstep; do kill -KILL -- -${L[$m]} 2>/dev/null; done
cd /tmp && tar czf $OUT/cap.tgz cap && ls -la $OUT

#!/usr/bin/env bash
# Distributed training with torchrun: dist_train.sh CONFIG NPROC [train.py args]
# Without GPUs the processes use the gloo backend (env_cfg.dist_cfg.backend
# overrides it), so the same command runs on a laptop.
set -euo pipefail
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" --master_port="$PORT" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${@:3}"

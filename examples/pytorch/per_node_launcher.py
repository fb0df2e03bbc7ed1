"""Starts NPROC_PER_NODE processes of a training script on this node, with
the variables torchrun would give them, from the ones dlbatch gives a
`launch: per-node` job (NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR,
MASTER_PORT):

    RANK = NODE_RANK * NPROC_PER_NODE + local rank
    WORLD_SIZE = NNODES * NPROC_PER_NODE

(every node has the same NPROC_PER_NODE, as torchrun's --nproc_per_node
assumes). A stand-in for `torchrun --nnodes=$NNODES --node_rank=$NODE_RANK
--nproc_per_node=$NPROC_PER_NODE --master_addr=$MASTER_ADDR
--master_port=$MASTER_PORT script.py`, which fails on Debian 12's torch 1.13
under Python 3.11 ("'NoneType' object has no attribute 'get'").

Usage: per_node_launcher.py script.py [args...]. A stop signal (TERM, INT,
USR1, USR2) is passed on to every process; if one fails the others are
stopped and the launcher exits with its code.
"""

import os
import signal
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: per_node_launcher.py script.py [args...]")
    nnodes = int(os.environ["NNODES"])
    node_rank = int(os.environ["NODE_RANK"])
    nproc = int(os.environ["NPROC_PER_NODE"])
    threads = max(1, int(os.environ.get("OMP_NUM_THREADS", nproc)) // nproc)
    procs = []
    for local in range(nproc):
        env = dict(os.environ)
        env.update({
            "RANK": str(node_rank * nproc + local),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(nnodes * nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(node_rank),
            "ROLE_RANK": str(node_rank * nproc + local),
            "ROLE_WORLD_SIZE": str(nnodes * nproc),
            "OMP_NUM_THREADS": str(threads),
        })
        procs.append(subprocess.Popen([sys.executable] + sys.argv[1:], env=env))

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)

    code = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and code == 0:
                code = rc if rc > 0 else 128 - rc
                forward(signal.SIGTERM, None)
        time.sleep(0.1)
    for p in procs:
        if code == 0 and p.returncode != 0:
            code = p.returncode if p.returncode > 0 else 128 - p.returncode
    sys.exit(code)


if __name__ == "__main__":
    main()

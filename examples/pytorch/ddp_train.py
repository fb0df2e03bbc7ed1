"""Data-parallel training with PyTorch's DistributedDataParallel, as dlbatch
launches it: every process reads torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the same script runs under
`launch: per-slot`, under torchrun or a launcher inside `launch: per-node`,
and by hand.

Each rank trains on its slice of every global mini-batch; DDP averages the
gradients, so all ranks end with the weights one process would reach on the
whole batch (`--reference` computes those without torch.distributed).
Prints `weights RANK: [...]` at the end and writes rank 0's weights to
$DLBATCH_OUTPUT_DIR/weights.json.

Uses only torch (Debian's python3-torch is enough); gloo on CPUs, nccl on
GPUs.
"""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def global_batch(step, size):
    """The step's whole mini-batch, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def flat_weights(model):
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def train(model, steps, batch, lr, rank, world, device):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    per_rank = batch // world
    for step in range(steps):
        x, y = global_batch(step, batch)
        x = x[rank * per_rank:(rank + 1) * per_rank].to(device)
        y = y[rank * per_rank:(rank + 1) * per_rank].to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64, help="global mini-batch")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--reference", action="store_true",
                    help="one process on the whole batch, no torch.distributed")
    args = ap.parse_args()

    if args.reference:
        model = make_model()
        train(model, args.steps, args.batch, args.lr, 0, 1, "cpu")
        print("weights reference: " + json.dumps(flat_weights(model)))
        return

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.batch % world != 0:
        raise SystemExit(f"--batch {args.batch} does not split over {world} ranks")
    use_gpu = torch.cuda.is_available()
    if use_gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    # env://: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
    dist.init_process_group("nccl" if use_gpu else "gloo")
    print(f"rank {rank} of {world} (local rank {local_rank}) on "
          f"{socket.gethostname()}, master "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    model = make_model().to(device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if use_gpu else None)
    train(ddp, args.steps, args.batch, args.lr, rank, world, device)
    weights = flat_weights(model)
    print(f"weights {rank}: " + json.dumps(weights), flush=True)
    out = os.environ.get("DLBATCH_OUTPUT_DIR")
    if rank == 0 and out:
        with open(os.path.join(out, "weights.json"), "w") as f:
            json.dump(weights, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

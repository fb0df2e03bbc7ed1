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

Under dlbatch it uses the `dlbatch` module (on a command job's PYTHONPATH):

- rank 0 reports iteration, iterations, loss and samples_per_s, which
  `dlbatch jobs`, `show` and the job's training_history.csv show;
- every --checkpoint-every steps rank 0 saves the model, the optimizer and
  the step into dlbatch.checkpoint_dir() and says so; an attempt that
  resumes (requeued, preempted, a worker lost) loads it on every rank
  (each part's worker lays the stored checkpoint out again in its own
  $DLBATCH_CHECKPOINT_DIR; a rank that lacks the file gets rank 0's copy
  over torch.distributed) and ends with the weights of a run never
  interrupted;
- when the job is asked to stop (cancel, time limit, preemption) the ranks
  agree on it at the end of a step, rank 0 saves a checkpoint, and all
  exit.

By hand, without the module, all of that is skipped and the script trains
as before.

Uses only torch (Debian's python3-torch is enough); gloo on CPUs, nccl on
GPUs.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    import dlbatch
except ImportError:  # run by hand: nothing to report to, nothing to resume

    class dlbatch:  # noqa: N801 (stands in for the module)
        @staticmethod
        def report(**metrics):
            return False

        @staticmethod
        def checkpoint_dir():
            path = os.path.join(os.getcwd(), "checkpoints")
            os.makedirs(path, exist_ok=True)
            return path

        @staticmethod
        def checkpoint_saved(step):
            return False

        @staticmethod
        def resumed_from():
            return None

        @staticmethod
        def should_stop():
            return False


CHECKPOINT = "ddp_train.pt"


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def global_batch(step, size):
    """The step's whole mini-batch, the same on every rank and attempt."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def flat_weights(model):
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def save_checkpoint(model, opt, step):
    """Rank 0: the state after `step` steps, written whole under a temporary
    name and renamed into place (the worker may read the folder at any
    time), then announced."""
    path = os.path.join(dlbatch.checkpoint_dir(), CHECKPOINT)
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "step": step}, tmp)
    os.replace(tmp, path)
    dlbatch.checkpoint_saved(step)


# The tensors agreed() reduces, one per device, alive until the process
# exits. A gloo thread keeps the last tensor it reduced until it is stopped;
# if that were the last reference to a tensor made in Python, the thread
# would need the GIL to free it while the main thread, holding the GIL,
# waits for the thread in the process group's destructor: torch 1.13 hangs
# at exit.
_agreement = {}


def agreed(value, op, device):
    """`value` reduced over all ranks (every rank must call it)."""
    t = _agreement.setdefault(str(device),
                              torch.zeros(1, dtype=torch.int64, device=device))
    t.fill_(value)
    dist.all_reduce(t, op=op)
    return int(t.item())


def load_checkpoint(rank, device):
    """The state of the stored checkpoint on every rank, or None on a fresh
    start. Every rank decides together, so none waits for a collective the
    others skip."""
    mine = dlbatch.resumed_from()
    step = agreed(-1 if mine is None else mine, dist.ReduceOp.MAX, device)
    if step < 0:
        return None
    path = os.path.join(dlbatch.checkpoint_dir(), CHECKPOINT)
    everywhere = agreed(int(os.path.exists(path)), dist.ReduceOp.MIN, device)
    if everywhere:
        state = torch.load(path, map_location="cpu")
    else:
        # A part whose worker did not lay the folder out: rank 0's copy.
        box = [None]
        if rank == 0:
            if not os.path.exists(path):
                raise SystemExit(
                    f"resuming from step {step} but {path} is missing; "
                    "save the checkpoint as " + CHECKPOINT)
            box[0] = torch.load(path, map_location="cpu")
        dist.broadcast_object_list(box, src=0)
        state = box[0]
    if state["step"] != step:
        raise SystemExit(f"{path} holds step {state['step']}, but dlbatch "
                         f"resumed from step {step}")
    return state


def train(model, opt, start, args, rank, world, device, distributed):
    """Steps start..args.steps-1; returns the steps done and whether the
    job was asked to stop."""
    per_rank = args.batch // world
    module = model.module if distributed else model
    done = start
    window_at, window_steps = time.monotonic(), 0
    began = time.monotonic()
    stopped = False
    for step in range(start, args.steps):
        x, y = global_batch(step, args.batch)
        x = x[rank * per_rank:(rank + 1) * per_rank].to(device)
        y = y[rank * per_rank:(rank + 1) * per_rank].to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if args.step_delay:
            time.sleep(args.step_delay)
        done = step + 1
        window_steps += 1
        last = done == args.steps
        if rank == 0 and (done % args.report_every == 0 or last):
            now = time.monotonic()
            dlbatch.report(iteration=done, iterations=args.steps,
                           loss=loss.item(),
                           samples_per_s=window_steps * args.batch /
                           max(now - window_at, 1e-9))
            window_at, window_steps = now, 0
        if step % args.log_every == 0 or last:
            print(f"rank {rank} step {step} loss {loss.item():.6f}",
                  flush=True)
        # Every rank stops at the same step, or the others would wait in
        # the next step's allreduce.
        stop = dlbatch.should_stop()
        if distributed:
            stop = agreed(int(stop), dist.ReduceOp.MAX, device) == 1
        if rank == 0 and (stop or (args.checkpoint_every > 0 and
                                   done % args.checkpoint_every == 0)):
            save_checkpoint(module, opt, done)
        if stop:
            stopped = True
            break
    took = time.monotonic() - began
    print(f"rank {rank} trained {done - start} steps in {took:.3f} s "
          f"({(done - start) / max(took, 1e-9):.1f} steps/s)", flush=True)
    return done, stopped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64, help="global mini-batch")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                    help="rank 0 saves a checkpoint every N steps (0: only "
                    "when asked to stop)")
    ap.add_argument("--report-every", type=int, default=1, metavar="N",
                    help="rank 0 reports progress every N steps")
    ap.add_argument("--log-every", type=int, default=10, metavar="N",
                    help="every rank prints its loss every N steps")
    ap.add_argument("--step-delay", type=float, default=0, metavar="S",
                    help="sleep S seconds after each step (to watch a run "
                    "or stop it mid-way)")
    ap.add_argument("--reference", action="store_true",
                    help="one process on the whole batch, no torch.distributed")
    args = ap.parse_args()
    for name in ("steps", "batch", "report_every", "log_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.checkpoint_every < 0 or args.step_delay < 0:
        ap.error("--checkpoint-every and --step-delay must not be negative")
    if args.reference:
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        train(model, opt, 0, args, 0, 1, "cpu", False)
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
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    state = load_checkpoint(rank, device)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if use_gpu else None)
    done, stopped = train(ddp, opt, start, args, rank, world, device, True)
    if stopped:
        print(f"rank {rank} stopped at step {done} of {args.steps}", flush=True)
    else:
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

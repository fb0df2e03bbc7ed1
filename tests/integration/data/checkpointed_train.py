"""A small deterministic PyTorch training run that checkpoints through the
dlbatch module every 20 steps and resumes from what dlbatch lays out again.
Its final weights, written as text, are the same run after run: a resumed
run must end with exactly the weights of one never interrupted.

    checkpointed_train.py STEPS SLEEP_S
"""
import os
import sys
import time

import torch

import dlbatch

steps = int(sys.argv[1])
sleep_s = float(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
# The data: fixed by its own generator, the same for every attempt.
g = torch.Generator().manual_seed(1)
x = torch.randn(512, 8, generator=g)
y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ckpt = os.path.join(dlbatch.checkpoint_dir(), "state.pt")
start = 0
if dlbatch.resumed_from() is not None:
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.set_rng_state(state["rng"])
    start = state["step"]
    assert start == dlbatch.resumed_from(), (start, dlbatch.resumed_from())
    print(f"resumed at step {start}", flush=True)

for step in range(start, steps):
    # Each step's batch from the run's own random stream (kept in the
    # checkpoint), so a resumed run draws what the uninterrupted one did.
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    done = step + 1
    dlbatch.report(iteration=done, iterations=steps, loss=loss.item())
    if done % 20 == 0:
        tmp = ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "rng": torch.get_rng_state(), "step": done}, tmp)
        os.replace(tmp, ckpt)
        dlbatch.checkpoint_saved(done)
    time.sleep(sleep_s)

out = os.environ.get("DLBATCH_OUTPUT_DIR", ".")
with open(os.path.join(out, "weights.txt"), "w") as f:
    for p in model.parameters():
        f.write(" ".join(v.hex() for v in p.detach().double().flatten().tolist()))
        f.write("\n")
print("trained", steps, "steps", flush=True)

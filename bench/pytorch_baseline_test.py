#!/usr/bin/python3
"""Checks of bench/pytorch_baseline.py's --compile, runnable without a GPU.

1. Where this PyTorch has no torch.compile (Debian 12's is 1.13), --compile
   exits with status 2 and a message that says what to change.
2. The compilation before the clock (compile_model) leaves no trace in the
   training: with torch.compile stood in for by the identity (this PyTorch
   has no compiler to run; the passes and the restore are what is checked),
   `--compile default` trains the small ResNet (batch norms: running
   statistics the passes move) to exactly the eager run's loss and accuracy.

Exits 0 when both hold, 1 when one fails, 77 (ctest's skip) where
/usr/bin/python3 has no torch.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BASELINE = os.path.join(HERE, "pytorch_baseline.py")

try:
    import torch
except ImportError:
    print("skipped: this Python has no torch (run it with Debian's "
          "/usr/bin/python3 and python3-torch)")
    sys.exit(77)

ARGS = ["--model", "resnet", "--batch", "32", "--threads", "1",
        "--max-iterations", "6", "--seed", "3"]

# pytorch_baseline.main() with torch.compile stood in for by the identity,
# which reports the mode it was called with on stderr.
IDENTITY_COMPILE = """
import sys, torch
def identity_compile(model, mode=None):
    sys.stderr.write("identity compile: %s\\n" % mode)
    return model
torch.compile = identity_compile
sys.path.insert(0, sys.argv[1])
import pytorch_baseline
sys.argv = sys.argv[2:]
sys.exit(pytorch_baseline.main())
"""


def run(argv):
    """Runs argv; its JSON result and stderr."""
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}: "
                         f"{p.stderr[-2000:]}")
    return json.loads(p.stdout), p.stderr


def main():
    failures = 0
    if not hasattr(torch, "compile"):
        p = subprocess.run([sys.executable, BASELINE, *ARGS, "--compile",
                            "default"], capture_output=True, text=True)
        if p.returncode != 2 or "torch.compile" not in p.stderr \
                or "without --compile" not in p.stderr:
            print(f"FAIL: --compile on PyTorch {torch.__version__}: exit "
                  f"{p.returncode}, stderr {p.stderr!r}")
            failures += 1
        else:
            print(f"ok: --compile refused on PyTorch {torch.__version__}: "
                  f"{p.stderr.strip()}")

    eager, _ = run([sys.executable, BASELINE, *ARGS])
    compiled, err = run([sys.executable, "-c", IDENTITY_COMPILE, HERE,
                         BASELINE, *ARGS, "--compile", "default"])
    calls = [line for line in err.splitlines()
             if line.startswith("identity compile:")]
    if calls != ["identity compile: default"]:
        print(f"FAIL: torch.compile called as {calls}, not once in mode "
              f"default")
        failures += 1
    for key in ("final_train_loss", "test_accuracy", "test_loss",
                "iterations"):
        if eager[key] != compiled[key]:
            print(f"FAIL: {key}: eager {eager[key]!r}, after the compile "
                  f"passes {compiled[key]!r} (the passes before the clock "
                  f"changed the training)")
            failures += 1
    if compiled["build_time_s"] is None or eager["build_time_s"] is not None:
        print(f"FAIL: build_time_s: eager {eager['build_time_s']!r}, "
              f"compiled {compiled['build_time_s']!r}")
        failures += 1
    if failures == 0:
        print(f"ok: --compile default (identity compiler) trains as eager: "
              f"loss {eager['final_train_loss']:.6f}, test accuracy "
              f"{eager['test_accuracy']:.2f}%")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

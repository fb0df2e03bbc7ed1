#!/usr/bin/python3
"""PyTorch baseline for trainer_bench: the same networks, solver and data as
bench/jobs/{lenet,blocks,resnet,resnet9}.yaml, trained with PyTorch on the
CPU or, with --device cuda, on one GPU.

--model resnet is examples/resnet-fashion-mnist.yaml's small ResNet;
--model resnet9 is David Page's ResNet-9 on 32x32x3 images, read with
--cifar-dir from CIFAR-10's binary batches (trainer_bench writes a synthetic
set in that format). --nesterov and --label-smoothing match the job files'
nesterov and label_smoothing. --precision bf16 runs the forward pass under
torch.autocast("cpu", torch.bfloat16) (float32 master weights, the loss in
float32), what dlbatch's `precision: bf16` is compared with. With --device
cuda, --precision bf16 and fp16 are eager AMP: torch.autocast("cuda", ...),
fp16 with a GradScaler (dynamic loss scaling, as dlbatch's fp16 does), and
--precision tf32 allows TF32 in cuDNN and cuBLAS (no autocast). --compile
MODE runs the model through torch.compile (PyTorch 2.0 or later; an older
PyTorch exits with status 2 saying so): its compilation happens before the
clock, on the first batch's forward and backward passes (three, for the CUDA
graphs of reduce-overhead), with the weights, statistics and gradients put
back after, and is reported as build_time_s, as dlbatch-train reports its
network build and algorithm search. The test evaluation runs the same
weights eagerly.

Run with Debian's /usr/bin/python3 (python3-torch). Give it its best BLAS:
libopenblas0-openmp selected for libblas.so.3, and OPENBLAS_CORETYPE=SkylakeX
on AVX-512 machines (trainer_bench sets it).

  /usr/bin/python3 bench/pytorch_baseline.py --model lenet --batch 64 \
      --threads 2 --epochs 1

Prints one JSON object on stdout:
  {"model", "batch", "threads", "epochs", "images_per_s", "test_accuracy",
   "test_loss", "train_time_s", ...}
images_per_s counts the training steps only (batch gathering, forward,
backward, solver step), not the test evaluation; test_accuracy is in percent
on the full t10k set after the last epoch.

The solver is dlbatch's (MATLAB's trainingOptions, Caffe's lenet_solver):
SGD with momentum, learn rate base * (1 + gamma * iter)^(-power) (Caffe's
`inv`, iter counted from 0 over all epochs), L2 on weights only (not biases
or batchnorm), a fresh shuffle every epoch, the last partial batch dropped.
PyTorch's best configuration on this machine is the default: oneDNN on,
channels_last, OpenBLAS (for the fully connected layers) with
OPENBLAS_CORETYPE=SkylakeX; see bench/RESULTS.md.

With --device cuda the model, the whole data set (both splits, loaded once
before the clock starts, about 220 MB as float32) and every step live on the
GPU, so batch gathering is one index_select on the device and no loader or
host-to-device copy limits the baseline; dlbatch-train, by contrast, copies
each batch from host memory. Arithmetic is float32: TF32 is switched off for
cuDNN convolutions and cuBLAS matrix products. cudnn.benchmark is on (the
fastest algorithm per shape, searched during the first step; dlbatch-train
searches while building its network, before its first step, and reports that
as build_time_s). The first step is timed apart (first_step_s, after a
torch.cuda.synchronize()), so that trainer_bench can compare the steps after
it on both sides. The timed region starts and ends with
torch.cuda.synchronize(). On the CPU the first step is timed apart too
(first_step_s), for the cases of a few steps. channels_last and the foreach SGD
default to off and on there (PyTorch's own defaults on CUDA); the CPU path's
defaults are unchanged. Where no CUDA device is usable it exits with status 2
and a message on stderr.

Initialisation follows dlbatch's Network::Initialize: conv/fc weights that
feed a relu (through any batchnorm) He-normal, other weights Glorot-uniform,
biases 0 (--init torch keeps PyTorch's defaults instead).
"""

import argparse
import contextlib
import ctypes
import gzip
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """Reads an IDX file (gzipped or not) into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        raise ValueError(f"{path}: {data.size} bytes of data, header says "
                         f"{dims}")
    return data.reshape(dims)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x.contiguous(), y


class LeNet(nn.Module):
    """Caffe's LeNet: conv20 5x5, pool, conv50 5x5, pool, fc500, relu, fc10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(50 * 4 * 4, 500)
        self.fc2 = nn.Linear(500, 10)
        # (module, feeds a relu) for dlbatch's initialisation rule.
        self.init_plan = [(self.conv1, False), (self.conv2, False),
                          (self.fc1, True), (self.fc2, False)]

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2, 2)
        x = F.max_pool2d(self.conv2(x), 2, 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class Blocks(nn.Module):
    """MATLAB's CIFAR-10-style blocks on 28x28x1: [conv3x3 same, bn, relu]
    x {16, 32, 64} with 2/2 max pooling between, global average pool, fc10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 10)
        self.init_plan = [(self.conv1, True), (self.conv2, True),
                          (self.conv3, True), (self.fc, False)]

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2, 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2, 2)
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def conv_bn(cin, cout):
    """conv 3x3 'same' then batchnorm (the relu is the caller's)."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1),
                         nn.BatchNorm2d(cout))


class ResNetSmall(nn.Module):
    """examples/resnet-fashion-mnist.yaml: the blocks network with a residual
    block (conv-bn-relu-conv-bn added to the block's input, then relu) at
    each of its first two widths."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(1, 16)
        self.a1, self.b1 = conv_bn(16, 16), conv_bn(16, 16)
        self.wide = conv_bn(16, 32)
        self.a2, self.b2 = conv_bn(32, 32), conv_bn(32, 32)
        self.top = conv_bn(32, 64)
        self.fc = nn.Linear(64, 10)
        # Every conv feeds a relu (through batchnorm and add).
        self.init_plan = [(m[0], True) for m in (
            self.stem, self.a1, self.b1, self.wide, self.a2, self.b2,
            self.top)] + [(self.fc, False)]

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.max_pool2d(F.relu(x + self.b1(F.relu(self.a1(x)))), 2, 2)
        x = F.relu(self.wide(x))
        x = F.max_pool2d(F.relu(x + self.b2(F.relu(self.a2(x)))), 2, 2)
        x = F.relu(self.top(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class ResNet9(nn.Module):
    """David Page's ResNet-9 (examples/resnet9-cifar10.yaml): prep conv 64;
    conv 128 + pool + residual of two conv-bn-relu; conv 256 + pool; conv
    512 + pool + residual; max pool 4; fc 10. Every conv 3x3 'same', then
    batchnorm and relu."""

    def __init__(self):
        super().__init__()
        self.prep = conv_bn(3, 64)
        self.l1 = conv_bn(64, 128)
        self.r1a, self.r1b = conv_bn(128, 128), conv_bn(128, 128)
        self.l2 = conv_bn(128, 256)
        self.l3 = conv_bn(256, 512)
        self.r3a, self.r3b = conv_bn(512, 512), conv_bn(512, 512)
        self.fc = nn.Linear(512, 10)
        self.init_plan = [(m[0], True) for m in (
            self.prep, self.l1, self.r1a, self.r1b, self.l2, self.l3,
            self.r3a, self.r3b)] + [(self.fc, False)]

    def forward(self, x):
        x = F.relu(self.prep(x))
        x = F.max_pool2d(F.relu(self.l1(x)), 2)
        x = x + F.relu(self.r1b(F.relu(self.r1a(x))))
        x = F.max_pool2d(F.relu(self.l2(x)), 2)
        x = F.max_pool2d(F.relu(self.l3(x)), 2)
        x = x + F.relu(self.r3b(F.relu(self.r3a(x))))
        x = torch.flatten(F.max_pool2d(x, 4), 1)
        return self.fc(x)


def read_cifar10(paths):
    """CIFAR-10's binary batches: records of a label byte and 3072 bytes of
    pixels (red, green, blue planes of 32x32)."""
    raw = b"".join(open(p, "rb").read() for p in paths)
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3073)
    x = torch.from_numpy(records[:, 1:].reshape(-1, 3, 32, 32)
                         .astype(np.float32) / 255.0)
    y = torch.from_numpy(records[:, 0].astype(np.int64))
    return x.contiguous(), y


def init_like_dlbatch(model):
    for module, feeds_relu in model.init_plan:
        if feeds_relu:
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        else:
            nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def param_groups(model, l2):
    """Weights of conv/fc layers get L2; biases and batchnorm do not."""
    decayed, plain = [], []
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            decayed.append(module.weight)
            plain.append(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            plain += [module.weight, module.bias]
    return [{"params": decayed, "weight_decay": l2},
            {"params": plain, "weight_decay": 0.0}]


def compile_model(net, model, optimizer, xb, yb, autocast, memory_format,
                  args, passes):
    """Runs torch.compile's compilation of `net` (model compiled) outside
    the clock: `passes` forward and backward passes on one batch of the
    training steps' shape, after which the parameters and batch-norm
    statistics are put back and the gradients dropped, so that training
    starts from the same state as an eager run."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    xb = xb.contiguous(memory_format=memory_format)
    for _ in range(passes):
        with autocast:
            logits = net(xb)
        F.cross_entropy(logits.float(), yb,
                        label_smoothing=args.label_smoothing).backward()
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(saved[k])
    optimizer.zero_grad(set_to_none=True)


def evaluate(model, x, y, memory_format, batch=1000):
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            xb = x[i:i + batch].contiguous(memory_format=memory_format)
            logits = model(xb)
            loss_sum += F.cross_entropy(logits, y[i:i + batch],
                                        reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    n = x.shape[0]
    return 100.0 * correct / n, loss_sum / n


def blas_info():
    """What BLAS and oneDNN this process really uses."""
    info = {"mkldnn_available": torch.backends.mkldnn.is_available(),
            "mkldnn_enabled": torch.backends.mkldnn.enabled,
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", "")}
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        info["openblas_core"] = lib.openblas_get_corename().decode()
        info["openblas_config"] = lib.openblas_get_config().decode()
        info["openblas_parallel"] = {0: "sequential", 1: "pthreads",
                                     2: "openmp"}.get(
                                         lib.openblas_get_parallel(), "?")
    except (OSError, AttributeError) as e:
        info["openblas_core"] = f"not loaded ({e})"
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps
                       if "blas" in line or "lapack" in line
                       or "dnnl" in line})
    info["mapped_libraries"] = libs
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model",
                        choices=["lenet", "blocks", "resnet", "resnet9"],
                        default="lenet")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--l2", type=float, default=5e-4)
    parser.add_argument("--gamma", type=float, default=1e-4)
    parser.add_argument("--power", type=float, default=0.75)
    parser.add_argument("--schedule", choices=["inv", "cosine"], default="inv",
                        help="inv (Caffe's, with --gamma/--power) or cosine "
                        "over the whole run after --warmup linear steps")
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--nesterov", action="store_true",
                        help="SGD with Nesterov's momentum")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--data-dir", default=DATA_DIR)
    parser.add_argument("--cifar-dir", default="",
                        help="train on CIFAR-10 binary batches from this "
                        "folder (data_batch_*.bin, test_batch.bin) instead "
                        "of Fashion-MNIST")
    parser.add_argument("--precision",
                        choices=["fp32", "bf16", "fp16", "tf32"],
                        default="fp32",
                        help="bf16: forward and loss under torch.autocast("
                        "on the device, torch.bfloat16) (float32 master "
                        "weights); fp16 (CUDA): autocast with float16 and a "
                        "GradScaler; tf32 (CUDA): TF32 allowed, no autocast")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model, data and steps live")
    parser.add_argument("--mkldnn", choices=["on", "off"], default="on",
                        help="torch.backends.mkldnn.enabled")
    parser.add_argument("--channels-last",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="model and inputs in torch.channels_last "
                        "(default: on the CPU, the fastest there: oneDNN runs "
                        "NHWC without reorders; off on CUDA)")
    parser.add_argument("--foreach", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="SGD's multi-tensor (foreach) implementation "
                        "(default: off on the CPU, on on CUDA)")
    parser.add_argument("--compile", default="off",
                        choices=["off", "default", "reduce-overhead",
                                 "max-autotune"],
                        help="torch.compile the model in this mode "
                        "(PyTorch 2.0 or later), compiled before the clock")
    parser.add_argument("--init", choices=["dlbatch", "torch"],
                        default="dlbatch")
    parser.add_argument("--max-iterations", type=int, default=0,
                        help="stop after this many steps (0: whole epochs)")
    parser.add_argument("--info", action="store_true",
                        help="add the BLAS/oneDNN configuration to the JSON")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if args.channels_last is None:
        args.channels_last = not cuda
    if args.foreach is None:
        args.foreach = cuda
    if cuda:
        if not torch.cuda.is_available():
            sys.stderr.write(
                f"pytorch_baseline.py: --device cuda, but this PyTorch "
                f"({torch.__version__}, {sys.executable}) sees no CUDA "
                f"device (built with CUDA: {torch.version.cuda or 'no'}); "
                f"run it where a GPU and a CUDA build of PyTorch are, or "
                f"use --device cpu\n")
            return 2
        tf32 = args.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    elif args.precision in ("fp16", "tf32"):
        sys.stderr.write(f"pytorch_baseline.py: --precision {args.precision} "
                         f"needs --device cuda\n")
        return 2
    if args.compile != "off" and not hasattr(torch, "compile"):
        sys.stderr.write(
            f"pytorch_baseline.py: --compile needs torch.compile, which "
            f"PyTorch has from 2.0 on; this one is {torch.__version__} "
            f"({sys.executable}): run it with a newer PyTorch, or without "
            f"--compile\n")
        return 2
    device = torch.device(args.device)

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    torch.manual_seed(args.seed)
    memory_format = (torch.channels_last if args.channels_last
                     else torch.contiguous_format)

    if args.cifar_dir:
        names = sorted(f for f in os.listdir(args.cifar_dir)
                       if f.startswith("data_batch_"))
        x_train, y_train = read_cifar10(
            [os.path.join(args.cifar_dir, f) for f in names])
        x_test, y_test = read_cifar10(
            [os.path.join(args.cifar_dir, "test_batch.bin")])
    else:
        x_train, y_train = load_split(args.data_dir, "train")
        x_test, y_test = load_split(args.data_dir, "t10k")
    if args.channels_last:
        x_train = x_train.contiguous(memory_format=memory_format)
        x_test = x_test.contiguous(memory_format=memory_format)
    if cuda:
        x_train, y_train = x_train.to(device), y_train.to(device)
        x_test, y_test = x_test.to(device), y_test.to(device)

    model = {"lenet": LeNet, "blocks": Blocks, "resnet": ResNetSmall,
             "resnet9": ResNet9}[args.model]()
    if args.init == "dlbatch":
        init_like_dlbatch(model)
    model = model.to(device=device, memory_format=memory_format)
    optimizer = torch.optim.SGD(param_groups(model, args.l2), lr=args.lr,
                                momentum=args.momentum,
                                nesterov=args.nesterov,
                                foreach=args.foreach)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    autocast = (torch.autocast(args.device, low) if low is not None
                else contextlib.nullcontext())
    # fp16's dynamic loss scaling (PyTorch's defaults: 2^16, halved on an
    # overflow, doubled after 2,000 clean steps, as dlbatch's).
    scaler = None
    if args.precision == "fp16":
        try:
            scaler = torch.amp.GradScaler("cuda")
        except (AttributeError, TypeError):
            scaler = torch.cuda.amp.GradScaler()

    n = x_train.shape[0]
    # What the steps run: the model, or its torch.compile'd form (the same
    # parameters; compiled here, before the clock).
    net = model
    build_time_s = None
    if args.compile != "off":
        start = time.perf_counter()
        net = torch.compile(model, mode=args.compile)
        compile_model(net, model, optimizer, x_train[:args.batch],
                      y_train[:args.batch], autocast, memory_format, args,
                      3 if args.compile == "reduce-overhead" else 1)
        if cuda:
            torch.cuda.synchronize()
        build_time_s = time.perf_counter() - start
    steps_per_epoch = n // args.batch  # the last partial batch is dropped
    total_iterations = steps_per_epoch * args.epochs
    if args.max_iterations:
        total_iterations = min(total_iterations, args.max_iterations)
    generator = torch.Generator().manual_seed(args.seed)
    iteration = 0
    train_time = 0.0
    train_cpu = 0.0  # CPU seconds of all threads: a load-robust cross-check
    last_loss = float("nan")
    first_step_s = None  # CUDA: the first step alone (algorithm search)
    done = False
    for _ in range(args.epochs):
        # Drawn on the CPU as before (the same order for a seed on either
        # device), copied to the GPU outside the clock.
        order = torch.randperm(n, generator=generator).to(device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        start_cpu = time.process_time()
        for step in range(steps_per_epoch):
            idx = order[step * args.batch:(step + 1) * args.batch]
            xb = x_train.index_select(0, idx)
            if args.channels_last:
                xb = xb.contiguous(memory_format=memory_format)
            yb = y_train.index_select(0, idx)
            if args.schedule == "cosine":
                # dlbatch's cosine: t is the progress after warm-up.
                span = max(1, total_iterations - args.warmup)
                t = min(max((iteration - args.warmup) / span, 0.0), 1.0)
                lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * t))
            else:
                lr = args.lr * (1.0 + args.gamma * iteration) ** (-args.power)
            if iteration < args.warmup:
                lr *= (iteration + 1) / args.warmup
            for group in optimizer.param_groups:
                group["lr"] = lr
            with autocast:
                logits = net(xb)
            loss = F.cross_entropy(logits.float(), yb,
                                   label_smoothing=args.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            iteration += 1
            if first_step_s is None:
                if cuda:
                    torch.cuda.synchronize()
                first_step_s = time.perf_counter() - start
            if args.max_iterations and iteration >= args.max_iterations:
                done = True
                break
        last_loss = loss.item()
        if cuda:
            torch.cuda.synchronize()
        train_time += time.perf_counter() - start
        train_cpu += time.process_time() - start_cpu
        if done:
            break

    with autocast:
        accuracy, test_loss = evaluate(model, x_test, y_test, memory_format)
    result = {
        "model": args.model,
        "batch": args.batch,
        "threads": args.threads,
        "epochs": args.epochs,
        "images_per_s": iteration * args.batch / train_time,
        "test_accuracy": accuracy,
        "test_loss": test_loss,
        "train_time_s": train_time,
        "train_cpu_s": train_cpu,
        "iterations": iteration,
        "final_train_loss": last_loss,
        "mkldnn": args.mkldnn,
        "channels_last": args.channels_last,
        "foreach": args.foreach,
        "init": args.init,
        "torch": torch.__version__,
        "device": args.device,
        "precision": args.precision,
        "first_step_s": first_step_s,
        "compile": args.compile,
        "build_time_s": build_time_s,
    }
    if cuda:
        result["device_name"] = torch.cuda.get_device_name(device)
        result["cudnn"] = torch.backends.cudnn.version()
        result["tf32"] = args.precision == "tf32"
    if args.info:
        result["config"] = blas_info()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a program run by dlbatch may tell it, and ask it.

Standard library only. The worker puts this module on a command job's
PYTHONPATH; outside dlbatch every call is harmless (reports go nowhere,
should_stop() is False until the process is sent SIGTERM).

    import dlbatch
    for step in range(start, steps):
        loss = train_step()
        dlbatch.report(iteration=step + 1, iterations=steps, loss=loss)
        if (step + 1) % 20 == 0 or dlbatch.should_stop():
            torch.save(state, os.path.join(dlbatch.checkpoint_dir(), "ckpt.pt"))
            dlbatch.checkpoint_saved(step + 1)
        if dlbatch.should_stop():
            break

report() writes one JSON line to the file $DLBATCH_PROGRESS names (a FIFO
the worker reads; see docs/user-guide.md, "Progress from any program").
It never blocks: a line the worker cannot take at once is dropped and
counted (dropped_reports()), so a job never waits on its reports.
"""

import errno
import json
import math
import os
import signal
import threading

__all__ = [
    "report",
    "checkpoint_dir",
    "checkpoint_saved",
    "should_stop",
    "resumed_from",
    "dropped_reports",
]

# The progress fields dlbatch shows as a train job's (any other numeric
# keyword is one of the job's own metrics).
PROGRESS_KEYS = (
    "iteration",
    "iterations",
    "epoch",
    "epochs",
    "loss",
    "accuracy",
    "learn_rate",
    "images_per_s",
    "elapsed_s",
    "eta_s",
    "validation_loss",
    "validation_accuracy",
)

_lock = threading.Lock()
_fd = None  # the channel's write end, opened on first use
_dropped = 0
_stop_asked = False
_handlers_set = False


def _number(name, value):
    """A JSON-ready number: ints stay ints, non-finite floats become the
    strings protobuf's JSON uses ("NaN", "Infinity", "-Infinity")."""
    if isinstance(value, bool):
        raise TypeError(f"dlbatch.report: {name}={value!r} is a bool, not a number")
    if hasattr(value, "item") and callable(value.item):
        value = value.item()  # a 0-d tensor or a numpy scalar
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    raise TypeError(
        f"dlbatch.report: {name}={value!r} is not a number "
        f"(give an int or a float)"
    )


def _open():
    global _fd
    if _fd is not None:
        return _fd
    path = os.environ.get("DLBATCH_PROGRESS")
    if not path:
        return None
    try:
        # Non-blocking: opening never waits for a reader, writing never
        # waits for room.
        _fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        _fd = None
    return _fd


def _write_line(line):
    """Writes one line whole, or not at all (counted)."""
    global _dropped, _fd
    data = line.encode("utf-8") + b"\n"
    with _lock:
        fd = _open()
        if fd is None:
            return False
        try:
            n = os.write(fd, data)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                # The worker is gone (EPIPE, ...): stop trying.
                try:
                    os.close(fd)
                except OSError:
                    pass
                _fd = None
            _dropped += 1
            return False
        # Lines up to PIPE_BUF bytes go in whole; a longer one may go in
        # parts: finish it, waiting for room, so the line is not torn.
        while n < len(data):
            try:
                n += os.write(fd, data[n:])
            except BlockingIOError:
                threading.Event().wait(0.001)
            except OSError:
                _dropped += 1
                return False
        return True


def report(**metrics):
    """Reports progress: the fields in PROGRESS_KEYS and any other numeric
    keywords (the job's own metrics, names of letters, digits and _).
    Returns True if the line went to the worker."""
    line = {}
    for name, value in metrics.items():
        line[name] = _number(name, value)
    return _write_line(json.dumps(line, allow_nan=False, separators=(",", ":")))


def checkpoint_dir():
    """The folder to write checkpoints into: $DLBATCH_CHECKPOINT_DIR under
    dlbatch, else ./checkpoints (made if missing)."""
    path = os.environ.get("DLBATCH_CHECKPOINT_DIR") or os.path.join(
        os.getcwd(), "checkpoints"
    )
    os.makedirs(path, exist_ok=True)
    return path


def checkpoint_saved(step):
    """Says the checkpoint for `step` is complete in checkpoint_dir(): the
    worker stores that folder as the job's checkpoint."""
    return _write_line(json.dumps({"checkpoint": _number("step", step)}))


def resumed_from():
    """The step of the stored checkpoint this attempt was started from
    (laid out in checkpoint_dir()), or None on a fresh start."""
    value = os.environ.get("DLBATCH_RESUMED_FROM")
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _on_signal(signum, frame):
    global _stop_asked
    _stop_asked = True


def _stop_signals():
    sigs = [signal.SIGTERM]
    name = os.environ.get("DLBATCH_PREEMPT_SIGNAL", "")
    if name:
        sig = getattr(signal, "SIG" + name.upper().removeprefix("SIG"), None)
        if sig is not None and sig not in sigs:
            sigs.append(sig)
    return sigs


def should_stop():
    """True once the job has been asked to stop: cancelled, at its time
    limit, or preempted. The first call (from the main thread) makes
    SIGTERM and the job's preempt_signal set this flag instead of ending
    the process, so the job can save a checkpoint and exit within its
    grace."""
    global _handlers_set
    if not _handlers_set and threading.current_thread() is threading.main_thread():
        _handlers_set = True
        for sig in _stop_signals():
            try:
                signal.signal(sig, _on_signal)
            except (ValueError, OSError):
                pass
    if _stop_asked:
        return True
    path = os.environ.get("DLBATCH_STOP_FILE")
    return bool(path) and os.path.exists(path)


def dropped_reports():
    """Reports not delivered (the worker's channel was full or gone)."""
    return _dropped

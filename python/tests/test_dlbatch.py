"""The dlbatch module against a real FIFO, as the worker makes it."""

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import dlbatch


class ModuleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.fifo = os.path.join(self.dir.name, "progress")
        os.mkfifo(self.fifo, 0o600)
        # The worker's side: read and write, so it never ends, non-blocking.
        self.reader = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        self.saved = dict(os.environ)
        for name in ("DLBATCH_PROGRESS", "DLBATCH_STOP_FILE",
                     "DLBATCH_CHECKPOINT_DIR", "DLBATCH_RESUMED_FROM",
                     "DLBATCH_PREEMPT_SIGNAL"):
            os.environ.pop(name, None)
        os.environ["DLBATCH_PROGRESS"] = self.fifo
        importlib.reload(dlbatch)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.saved)
        os.close(self.reader)
        self.dir.cleanup()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        importlib.reload(dlbatch)

    def lines(self):
        data = b""
        while True:
            try:
                chunk = os.read(self.reader, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return [json.loads(l) for l in data.decode().splitlines()]

    def test_report_writes_one_json_line(self):
        self.assertTrue(dlbatch.report(iteration=3, iterations=10, loss=0.5,
                                       my_metric=2))
        self.assertEqual(self.lines(), [
            {"iteration": 3, "iterations": 10, "loss": 0.5, "my_metric": 2}])

    def test_non_finite_numbers_become_protobuf_json_strings(self):
        dlbatch.report(loss=float("nan"), a=float("inf"), b=float("-inf"))
        self.assertEqual(self.lines(),
                         [{"loss": "NaN", "a": "Infinity", "b": "-Infinity"}])

    def test_scalars_with_item_are_numbers(self):
        class Scalar:
            def item(self):
                return 1.25
        dlbatch.report(loss=Scalar())
        self.assertEqual(self.lines(), [{"loss": 1.25}])

    def test_what_is_not_a_number_is_refused_by_name(self):
        with self.assertRaisesRegex(TypeError, "loss='x' is not a number"):
            dlbatch.report(loss="x")
        with self.assertRaisesRegex(TypeError, "done=True is a bool"):
            dlbatch.report(done=True)
        self.assertEqual(self.lines(), [])

    def test_checkpoint_saved(self):
        dlbatch.checkpoint_saved(40)
        self.assertEqual(self.lines(), [{"checkpoint": 40}])

    def test_outside_dlbatch_reports_go_nowhere(self):
        del os.environ["DLBATCH_PROGRESS"]
        importlib.reload(dlbatch)
        self.assertFalse(dlbatch.report(loss=1.0))
        self.assertFalse(dlbatch.should_stop())
        self.assertIsNone(dlbatch.resumed_from())

    def test_a_full_channel_drops_reports_and_never_blocks(self):
        start = time.monotonic()
        sent = sum(bool(dlbatch.report(iteration=i, loss=1.0))
                   for i in range(20000))
        self.assertLess(time.monotonic() - start, 10)
        self.assertGreater(dlbatch.dropped_reports(), 0)
        self.assertEqual(sent + dlbatch.dropped_reports(), 20000)
        # What went in went in whole.
        got = self.lines()
        self.assertEqual(len(got), sent)
        self.assertEqual(got[0], {"iteration": 0, "loss": 1.0})

    def test_a_line_longer_than_pipe_buf_is_not_torn(self):
        many = {f"m{i}": i for i in range(1000)}
        self.assertTrue(dlbatch.report(**many))
        self.assertEqual(self.lines(), [many])

    def test_should_stop_sees_the_stop_file(self):
        stop = os.path.join(self.dir.name, "stop")
        os.environ["DLBATCH_STOP_FILE"] = stop
        self.assertFalse(dlbatch.should_stop())
        with open(stop, "w") as f:
            f.write("preempted\n")
        self.assertTrue(dlbatch.should_stop())

    def test_checkpoint_dir_and_resumed_from(self):
        ckpt = os.path.join(self.dir.name, "ckpt")
        os.environ["DLBATCH_CHECKPOINT_DIR"] = ckpt
        os.environ["DLBATCH_RESUMED_FROM"] = "60"
        self.assertEqual(dlbatch.checkpoint_dir(), ckpt)
        self.assertTrue(os.path.isdir(ckpt))
        self.assertEqual(dlbatch.resumed_from(), 60)


class StopSignalTest(unittest.TestCase):
    """In a process of its own: the handlers are the process's."""

    def run_child(self, env_extra):
        script = (
            "import dlbatch, os, signal, sys, time\n"
            "assert not dlbatch.should_stop()\n"
            "print('ready', flush=True)\n"
            "for _ in range(500):\n"
            "    if dlbatch.should_stop():\n"
            "        print('stopping', flush=True); sys.exit(0)\n"
            "    time.sleep(0.01)\n"
            "sys.exit(3)\n")
        env = dict(os.environ, **env_extra)
        return subprocess.Popen([sys.executable, "-c", script], env=env,
                                stdout=subprocess.PIPE, text=True)

    def test_sigterm_after_should_stop_asks_to_stop(self):
        child = self.run_child({})
        self.assertEqual(child.stdout.readline().strip(), "ready")
        child.send_signal(signal.SIGTERM)
        self.assertEqual(child.stdout.readline().strip(), "stopping")
        self.assertEqual(child.wait(10), 0)
        child.stdout.close()

    def test_the_preempt_signal_asks_to_stop(self):
        child = self.run_child({"DLBATCH_PREEMPT_SIGNAL": "USR2"})
        self.assertEqual(child.stdout.readline().strip(), "ready")
        child.send_signal(signal.SIGUSR2)
        self.assertEqual(child.stdout.readline().strip(), "stopping")
        self.assertEqual(child.wait(10), 0)
        child.stdout.close()


if __name__ == "__main__":
    unittest.main()

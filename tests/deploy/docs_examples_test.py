#!/usr/bin/env python3
"""The documentation's commands, against the programs they name.

    docs_examples_test.py SOURCE_DIR BUILD_DIR [PAGE...]

1. Every command line of a ```sh block, and every `$ ` line of a ```console
   block, in README.md and docs/*.md that runs one of dlbatch's programs must
   name commands and options that program's --help has (read as
   deploy/gen-docs.py reads it for the man pages), so a renamed flag or
   command cannot stay in a page.
2. A block right after a line `<!-- docs-test: run -->` is run, in the order
   of the page, against a local cluster of the page's own (a temporary
   XDG_STATE_HOME, started with 2 CPU slots; the page's jobs are numbered
   from 1), from a folder holding
   a copy of examples/ with Fashion-MNIST linked into examples/data/. A sh
   block runs under `bash -e`: every command must succeed. In a console block
   each `$ ` line is run, and the lines shown after it must appear in what it
   printed, in that order (each as part of a line, later on the same line or
   on a later one; `...` skips nothing but reads better), and `(exit N)` says
   its exit code (else 0). A console command shown failing is not checked
   against --help: it may misspell a command on purpose.

Exits 0 when every check passes; the run part is skipped, saying why, where
Debian's Fashion-MNIST is not installed.
"""
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

PROGRAMS = ["dlbatch", "dlbatch-train", "dlbatch-scheduler", "dlbatch-worker"]
RUN_MARK = "<!-- docs-test: run -->"
DATA = "/usr/share/datasets/fashion-mnist"
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}


class Block:
    def __init__(self, page, line, lang, lines, run):
        self.page, self.line, self.lang = page, line, lang
        self.lines = lines  # [(line number, text)]
        self.run = run


def blocks_of(path):
    """The fenced code blocks of a Markdown file, with where they start."""
    blocks = []
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    i = 0
    while i < len(text):
        m = re.match(r"^```(\w*)\s*$", text[i])
        if not m:
            i += 1
            continue
        run = False
        j = i - 1
        while j >= 0 and not text[j].strip():
            j -= 1
        if j >= 0 and text[j].strip() == RUN_MARK:
            run = True
        lang, start, body = m.group(1), i + 1, []
        i += 1
        while i < len(text) and not text[i].startswith("```"):
            body.append((i + 1, text[i]))
            i += 1
        blocks.append(Block(path, start, lang, body, run))
        i += 1
    return blocks


def command_lines(block):
    """(line number, command text) of a block's commands, continuations
    joined; for a console block only its `$ ` lines, and of those only the
    ones the page says succeed (one shown failing with a usage error may
    name a command or flag that does not exist, on purpose)."""
    out = []
    pending, first = "", 0
    lines = block.lines
    if block.lang == "console":
        lines = [(n, command) for n, command, _, code in console_steps(block)
                 if code == 0]
        return lines
    for n, text in lines:
        if not pending:
            first = n
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        out.append((first, pending + text))
        pending = ""
    return out


def console_steps(block):
    """A console block's [line number, command, shown lines, exit code]."""
    steps, current = [], None
    for n, text in block.lines:
        if text.startswith("$ "):
            current = [n, text[2:], [], 0]
            steps.append(current)
        elif current is not None:
            m = re.match(r"^\(exit (\d+)\)$", text.strip())
            if m:
                current[3] = int(m.group(1))
            elif text.strip() and text.strip() != "...":
                current[2].append(" ".join(text.split()))
    return steps


def segments(command):
    """The simple commands of a shell line: its words, split at ; && | ..."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        return []
    out, current = [], []
    for w in words:
        if w in SEPARATORS:
            if current:
                out.append(current)
            current = []
        else:
            current.append(w)
    if current:
        out.append(current)
    return out


def program_of(words):
    """(program, its arguments) where the words run one of dlbatch's."""
    i = 0
    while i < len(words):
        w = words[i]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w) or w in ("env", "sudo", "exec"):
            i += 1
        elif w == "timeout" and i + 1 < len(words):
            i += 2
        elif w.startswith("-") and i > 0 and words[i - 1] in ("env", "sudo"):
            i += 1
        else:
            break
    if i >= len(words):
        return None, []
    name = os.path.basename(words[i])
    return (name, words[i + 1:]) if name in PROGRAMS else (None, [])


def check(tree, program, args):
    """A problem with `program args` against its --help tree, or None."""
    chain = [tree]
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            break
        if a.startswith("-") and len(a) > 1 and not re.match(r"^-\d", a):
            name = a.split("=", 1)[0]
            names = [name] if name.startswith("--") else (
                [name] if len(name) == 2 else ["-" + c for c in name[1:]])
            for nm in names:
                opt = next((o for c in reversed(chain) for o in c.options
                            if nm in o.names), None)
                if opt is None:
                    return (f"{' '.join(chain[-1].path)} has no option {nm} "
                            f"(see {' '.join(chain[-1].path)} --help)")
                if opt.value and "=" not in a and nm == names[-1]:
                    i += 1
            continue
        sub = next((s for s in chain[-1].subcommands if s.path[-1] == a), None)
        if sub is not None:
            chain.append(sub)
        elif chain[-1].subcommands and len(chain) == 1 and program == "dlbatch":
            return f"dlbatch has no command {a!r}"
    return None


def load_trees(build):
    spec = importlib.util.spec_from_file_location(
        "gen_docs", os.path.join(SOURCE, "deploy", "gen-docs.py"))
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    return {p: gen_docs.load(os.path.join(build, "bin", p), [p])
            for p in PROGRAMS}


def sandbox(build):
    root = tempfile.mkdtemp(prefix="dlbatch-docs-")
    work = os.path.join(root, "work")
    shutil.copytree(os.path.join(SOURCE, "examples"),
                    os.path.join(work, "examples"),
                    ignore=shutil.ignore_patterns("data"))
    data = os.path.join(work, "examples", "data")
    os.makedirs(data)
    for f in os.listdir(DATA):
        os.symlink(os.path.join(DATA, f), os.path.join(data, f))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DLBATCH_")}
    env.update(HOME=os.path.join(root, "home"),
               XDG_STATE_HOME=os.path.join(root, "state"),
               XDG_CONFIG_HOME=os.path.join(root, "config"),
               XDG_CACHE_HOME=os.path.join(root, "cache"),
               PATH=os.path.join(build, "bin") + ":" + env.get("PATH", ""),
               OMP_WAIT_POLICY="passive")
    for d in ("home", "state", "config", "cache"):
        os.makedirs(os.path.join(root, d))
    return root, work, env


def run_block(block, work, env):
    where = f"{os.path.relpath(block.page, SOURCE)}:{block.line}"
    if block.lang == "sh":
        script = "\n".join(t for _, t in block.lines)
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script],
                           cwd=work, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=900)
        if p.returncode != 0:
            return [f"{where}: the block exited {p.returncode}:\n{p.stdout}"]
        print(f"ran {where} (sh, {len(block.lines)} lines)")
        return []
    problems = []
    steps = console_steps(block)
    for n, command, expected, code in steps:
        p = subprocess.run(["bash", "-c", command], cwd=work, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)
        got = [" ".join(line.split()) for line in p.stdout.split("\n")]
        # Each shown line is found after the one before it: later on the
        # same printed line, or on a line after it.
        at, col = 0, 0
        for want in expected:
            while at < len(got) and got[at].find(want, col) < 0:
                at, col = at + 1, 0
            if at == len(got):
                problems.append(
                    f"{os.path.relpath(block.page, SOURCE)}:{n}: `{command}` "
                    f"did not print {want!r}; it printed:\n{p.stdout}")
                break
            col = got[at].find(want, col) + len(want)
        if p.returncode != code:
            problems.append(
                f"{os.path.relpath(block.page, SOURCE)}:{n}: `{command}` "
                f"exited {p.returncode}, the page says {code}:\n{p.stdout}")
    print(f"ran {where} (console, {len(steps)} commands)")
    return problems


def main():
    global SOURCE
    SOURCE, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    pages = sys.argv[3:] or (
        [os.path.join(SOURCE, "README.md")] +
        sorted(os.path.join(SOURCE, "docs", f)
               for f in os.listdir(os.path.join(SOURCE, "docs"))
               if f.endswith(".md")))
    trees = load_trees(build)
    problems, checked = [], 0
    by_page = {}
    for page in pages:
        by_page[page] = blocks_of(page)
        for b in by_page[page]:
            if b.lang not in ("sh", "console"):
                continue
            for n, command in command_lines(b):
                for words in segments(command):
                    program, args = program_of(words)
                    if program is None:
                        continue
                    checked += 1
                    problem = check(trees[program], program, args)
                    if problem:
                        problems.append(
                            f"{os.path.relpath(page, SOURCE)}:{n}: {problem}")
    print(f"{checked} documented commands checked against --help")
    if not os.path.isdir(DATA):
        print(f"SKIP running the pages' examples: no {DATA} "
              "(apt-get install dataset-fashion-mnist)")
    else:
        for page, blocks in by_page.items():
            runs = [b for b in blocks if b.run]
            if not runs:
                continue
            root, work, env = sandbox(build)
            try:
                # Two slots, as on the 2-core machines the pages describe.
                subprocess.run(["dlbatch", "local", "start", "--cpu-slots", "2"],
                               cwd=work, env=env, check=True,
                               stdout=subprocess.DEVNULL, timeout=120)
                for b in runs:
                    problems += run_block(b, work, env)
            finally:
                subprocess.run(["dlbatch", "local", "stop", "--force"],
                               cwd=work, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=120)
                shutil.rmtree(root, ignore_errors=True)
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()

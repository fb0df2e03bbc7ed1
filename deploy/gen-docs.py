#!/usr/bin/env python3
"""Man pages and shell completions from the built binaries' --help text.

    gen-docs.py --bin-dir BUILD/bin --out DIR --version V

Runs each program's --help (and, for the dlbatch CLI, every subcommand's,
nested ones too) and writes
    DIR/man/dlbatch.1 dlbatch-train.1 dlbatch-scheduler.8 dlbatch-worker.8
    DIR/bash-completion/<program>   (one file per program, as bash-completion
                                     loads them on demand)
    DIR/zsh/_dlbatch                (all four programs)
The --help text is CLI11's: a description, "Usage:", then sections
("Options:", "Subcommands:", ...) of two-space-indented entries whose
descriptions start in a column of their own and wrap onto indented lines.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

PROGRAMS = [  # name, man section, what it is, files it uses
    ("dlbatch", 1, "batch jobs for deep-learning training", []),
    ("dlbatch-train", 1, "the embedded trainer", []),
    ("dlbatch-scheduler", 8, "queues dlbatch jobs and places them on workers",
     [("/etc/dlbatch/scheduler.yaml", "settings (keys: the long options, "
       "with _ for -)"),
      ("/var/lib/dlbatch", "state: database, blobs, token, CA"),
      ("/run/dlbatch/scheduler.sock", "the Unix socket of the packaged "
       "configuration")]),
    ("dlbatch-worker", 8, "runs the jobs a dlbatch scheduler places on this "
     "machine",
     [("/etc/dlbatch/worker.yaml", "settings (keys: the long options, "
       "with _ for -)"),
      ("/var/lib/dlbatch-worker", "the jobs' working folders")]),
]


class Option:
    def __init__(self, names, value, text):
        self.names = names  # ["-f", "--follow"]
        self.value = value  # "TEXT", "INT:POSITIVE", ... or "" for a flag
        self.text = text

    def takes_file(self):
        return bool(self.value) and re.search(
            r"file|dir|path|folder|cert|key|attach", " ".join(self.names))


class Command:
    def __init__(self, path):
        self.path = path  # ["dlbatch", "admin", "user"]
        self.description = ""
        self.usage = ""
        self.sections = []  # (title, [(first column, text)])
        self.footer = ""
        self.options = []
        self.positionals = []  # (name, text)
        self.subcommands = []  # Command


def run_help(binary, args):
    out = subprocess.run([binary] + args + ["--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=30,
                         env=dict(os.environ, COLUMNS="80"))
    if out.returncode != 0:
        sys.exit(f"gen-docs: {binary} {' '.join(args)} --help exited "
                 f"{out.returncode}:\n{out.stdout}")
    return out.stdout


def parse_help(text, path):
    cmd = Command(path)
    lines = text.rstrip("\n").split("\n")
    i = 0
    desc = []
    while i < len(lines) and not lines[i].startswith("Usage:"):
        desc.append(lines[i])
        i += 1
    cmd.description = " ".join(l.strip() for l in desc if l.strip())
    if i < len(lines):
        usage = lines[i][len("Usage:"):].split()
        cmd.usage = " ".join(path + usage[len(path):])
        i += 1
    section = None
    footer = []
    for line in lines[i:]:
        if not line.strip():
            if section is not None and section[1]:
                section = None
            continue
        if not line.startswith(" ") and line.endswith(":") and not footer:
            section = (line[:-1], [])
            cmd.sections.append(section)
        elif section is not None and re.match(r"^  \S", line):
            first, _, rest = line[2:].partition("  ")
            section[1].append([first.strip(), rest.strip()])
        elif section is not None and section[1] and line.startswith("    "):
            entry = section[1][-1]
            entry[1] = (entry[1] + " " + line.strip()).strip()
        else:
            section = None
            footer.append(line.strip())
    cmd.footer = " ".join(footer)
    for title, entries in cmd.sections:
        for first, desc in entries:
            if title == "Subcommands":
                cmd.subcommands.append((first, desc))
            elif title == "Positionals":
                cmd.positionals.append((first.split()[0], desc))
            else:
                words = first.split()
                names = words[0].split(",")
                value = ""
                if len(words) > 1 and re.match(r"^[A-Z]", words[1]) and \
                        not words[1].endswith(":"):
                    value = " ".join(words[1:])
                cmd.options.append(Option(names, value, desc))
    return cmd


def load(binary, path, depth=0):
    cmd = parse_help(run_help(binary, path[1:]), path)
    subs = []
    for name, _ in cmd.subcommands:
        if depth < 3:
            subs.append(load(binary, path + [name], depth + 1))
    cmd.subcommands = subs
    return cmd


# ---- man pages -----------------------------------------------------------

def roff(text):
    text = text.replace("\\", "\\e").replace("-", "\\-")
    # A comma-separated list with no spaces (a.b,c,d) may break after each
    # comma (\: is a break point of no width), or troff cannot fill it.
    text = re.sub(r",(?=\S)", ",\\:", text)
    if text[:1] in (".", "'"):
        text = "\\&" + text
    return text


def option_head(opt):
    head = ", ".join("\\fB" + roff(n) + "\\fR" for n in opt.names)
    if opt.value:
        head += " \\fI" + roff(opt.value) + "\\fR"
    return head


def man_options(cmd, out):
    for name, text in cmd.positionals:
        out.append(".TP")
        out.append("\\fI" + roff(name) + "\\fR")
        out.append(roff(text))
    for opt in cmd.options:
        if opt.names == ["-h", "--help"]:
            continue
        out.append(".TP")
        out.append(option_head(opt))
        out.append(roff(opt.text) if opt.text else "")


def walk(cmd):
    yield cmd
    for sub in cmd.subcommands:
        yield from walk(sub)


def man_page(cmd, section, what, files, version, date):
    name = cmd.path[0]
    out = [f'.TH "{name.upper()}" "{section}" "{date}" "dlbatch {version}" '
           f'"dlbatch manual"',
           # Ragged right: option lists and paths cannot be justified.
           ".ad l",
           ".SH NAME", f"{roff(name)} \\- {roff(what)}",
           ".SH SYNOPSIS", ".B " + roff(name)]
    rest = cmd.usage.split()[1:]
    if rest:
        out.append(roff(" ".join(rest)))
    out += [".SH DESCRIPTION", roff(cmd.description)]
    if cmd.footer:
        out += [".PP", roff(cmd.footer)]
    out.append(".SH OPTIONS")
    man_options(cmd, out)
    if cmd.subcommands:
        out.append(".SH COMMANDS")
        for sub in list(walk(cmd))[1:]:
            out.append(".SS " + roff(" ".join(sub.path[1:])))
            out += [".B " + roff(sub.usage), ".PP", roff(sub.description)]
            man_options(sub, out)
    if files:
        out.append(".SH FILES")
        for path, text in files:
            out += [".TP", "\\fI" + roff(path) + "\\fR", roff(text)]
    others = [f"{p}({s})" for p, s, _, _ in PROGRAMS if p != name]
    out += [".SH SEE ALSO", roff(", ".join(others))]
    return "\n".join(out) + "\n"


# ---- completions ---------------------------------------------------------

def bash_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def bash_completion(cmd):
    """A completer that walks the words typed so far down the subcommand
    tree, then offers the subcommands or the options of where it is."""
    fn = "_" + re.sub(r"[^A-Za-z0-9]", "_", cmd.path[0])
    lines = [f"# bash completion for {cmd.path[0]} "
             "(generated by deploy/gen-docs.py from its --help)",
             "# shellcheck shell=bash disable=SC2207",
             f"{fn}() {{",
             "  local -A subs opts valued",
             ]
    for c in walk(cmd):
        key = " ".join(c.path)  # bash refuses an empty key
        subs = " ".join(s.path[-1] for s in c.subcommands)
        opts = " ".join(n for o in c.options for n in o.names)
        valued = " ".join(n for o in c.options if o.value for n in o.names)
        lines.append(f"  subs[{bash_quote(key)}]={bash_quote(subs)}")
        lines.append(f"  opts[{bash_quote(key)}]={bash_quote(opts)}")
        lines.append(f"  valued[{bash_quote(key)}]={bash_quote(valued)}")
    lines += [
        '  local cur=${COMP_WORDS[COMP_CWORD]} node=%s i w skip=0' %
        cmd.path[0],
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        "    w=${COMP_WORDS[i]}",
        "    if ((skip)); then skip=0; continue; fi",
        "    if [[ $w == -* ]]; then",
        '      [[ $w != *=* && " ${valued[$node]} " == *" $w "* ]] && skip=1',
        "      continue",
        "    fi",
        '    if [[ " ${subs[$node]} " == *" $w "* ]]; then',
        '      node="$node $w"',
        "    fi",
        "  done",
        "  COMPREPLY=()",
        "  if ((skip)); then",
        '    COMPREPLY=($(compgen -f -- "$cur"))',
        "  elif [[ $cur == -* ]]; then",
        '    COMPREPLY=($(compgen -W "${opts[$node]}" -- "$cur"))',
        '  elif [[ -n ${subs[$node]} ]]; then',
        '    COMPREPLY=($(compgen -W "${subs[$node]}" -- "$cur"))',
        "  else",
        '    COMPREPLY=($(compgen -f -- "$cur"))',
        "  fi",
        "}",
        f"complete -o filenames -F {fn} {cmd.path[0]}",
    ]
    return "\n".join(lines) + "\n"


def zsh_item(name, text):
    text = re.sub(r"\s+", " ", text)[:120]
    return "'" + (name.replace(":", "\\:") + ":" + text).replace(
        "'", "'\\''") + "'"


def zsh_completion(cmds):
    lines = ["#compdef " + " ".join(c.path[0] for c in cmds),
             "# zsh completion for dlbatch's programs (generated by "
             "deploy/gen-docs.py from their --help)",
             "_dlbatch() {",
             "  local -A subs opts valued",
             "  local -a items",
             ]
    for cmd in cmds:
        for c in walk(cmd):
            key = " ".join(c.path)
            subs = " ".join(zsh_item(s.path[-1], s.description)
                            for s in c.subcommands)
            opts = " ".join(zsh_item(n, o.text) for o in c.options
                            for n in o.names)
            valued = " ".join(n for o in c.options if o.value
                              for n in o.names)
            # zsh takes quotes in a subscript literally: pairs instead.
            k = bash_quote(key)
            lines.append(f"  subs+=({k} {bash_quote(subs)})")
            lines.append(f"  opts+=({k} {bash_quote(opts)})")
            lines.append(f"  valued+=({k} {bash_quote(valued)})")
    lines += [
        "  local node=${words[1]:t} w skip=0 i",
        "  for ((i = 2; i < CURRENT; i++)); do",
        "    w=${words[i]}",
        "    if ((skip)); then skip=0; continue; fi",
        "    if [[ $w == -* ]]; then",
        '      [[ $w != *=* && " ${valued[$node]} " == *" $w "* ]] && skip=1',
        "      continue",
        "    fi",
        '    items=(${(Q)${(z)subs[$node]}})',
        '    (( ${items[(I)${w}:*]} )) && node="$node $w"',
        "  done",
        "  if ((skip)); then",
        "    _files",
        "  elif [[ ${words[CURRENT]} == -* ]]; then",
        '    items=(${(Q)${(z)opts[$node]}})',
        "    _describe -t options option items",
        '  elif [[ -n ${subs[$node]} ]]; then',
        '    items=(${(Q)${(z)subs[$node]}})',
        "    _describe -t commands command items",
        "  else",
        "    _files",
        "  fi",
        "}",
        '_dlbatch "$@"',
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    args = ap.parse_args()
    # Reproducible: the date of the build's source, where given.
    stamp = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or None
    date = (datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc)
            if stamp else datetime.datetime.now(datetime.timezone.utc))
    date = date.strftime("%Y-%m-%d")
    for sub in ("man", "bash-completion", "zsh"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    cmds = []
    for name, section, what, files in PROGRAMS:
        cmd = load(os.path.join(args.bin_dir, name), [name])
        cmds.append(cmd)
        with open(os.path.join(args.out, "man", f"{name}.{section}"),
                  "w") as f:
            f.write(man_page(cmd, section, what, files, args.version, date))
        with open(os.path.join(args.out, "bash-completion", name), "w") as f:
            f.write(bash_completion(cmd))
    with open(os.path.join(args.out, "zsh", "_dlbatch"), "w") as f:
        f.write(zsh_completion(cmds))


if __name__ == "__main__":
    main()

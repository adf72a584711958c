#!/usr/bin/env python3
"""Checks with clang's -Wthread-safety that every GUARDED_BY field is read and written under its
lock, every REQUIRES function is called with it held and no EXCLUDES function with it held
(longhaul/base/thread_annotations.h). Run by ctest as `thread_safety` (labels lint, slow), after a
build, because it compiles from the build's compile_commands.json:

  scripts/check-thread-safety.py build/ci                 # every C++ translation unit
  scripts/check-thread-safety.py build/ci --jobs 2 -v     # list what is checked and how long
  scripts/check-thread-safety.py build/ci --all           # also those without annotations

Each C++ (.cc) translation unit of the compilation database -- production, tests, benchmarks -- is
parsed by clang++ -fsyntax-only with the same includes and defines, -Wthread-safety and -Werror
(gcc-only flags and the other warnings are dropped: this check is about locks). A translation unit
that includes thread_annotations.h neither directly nor through a project header is skipped: it
holds no annotations, so clang could not report anything. CUDA sources (.cu) are compiled by nvcc
and are not checked. Then two self-tests prove the check works: tests/thread_safety/
unguarded_read.cc (reads a GUARDED_BY field without the lock) must FAIL with clang's
"requires holding mutex" diagnostic, and tests/thread_safety/guarded_ok.cc (the documented ways
to hold the lock) must pass.

Exit status: 0 clean; 1 a thread-safety error (printed with file:line) or a failed self-test;
2 bad usage (no compile_commands.json, no clang++).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "longhaul/base/thread_annotations.h"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
CHECK_FLAGS = ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety",
               "-Wno-unknown-warning-option"]


def clang_arguments(entry, clangxx):
    """The entry's compiler command as a clang++ -fsyntax-only command."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [clangxx]
    skip = False
    for arg in args[1:]:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if arg in ("-c", "-MD", "-MMD") or arg.startswith("-W") or arg == "-Werror":
            continue
        if arg.startswith(("-fdiagnostics-color", "-fno-fat-lto", "-flto", "-fconcepts-diagnostics")):
            continue
        out.append(arg)
    return out + CHECK_FLAGS


def include_dirs(arguments, directory):
    dirs = []
    for i, arg in enumerate(arguments):
        path = None
        if arg in ("-I", "-isystem", "-iquote") and i + 1 < len(arguments):
            path = arguments[i + 1]
        elif arg.startswith("-I") and len(arg) > 2:
            path = arg[2:]
        if path:
            dirs.append(os.path.normpath(os.path.join(directory, path)))
    return dirs


class IncludeScanner:
    """Answers "does this file include MARKER, directly or through project headers?" by scanning
    quoted #includes (the project's own headers are all quoted; system headers are not scanned)."""

    def __init__(self):
        self.includes = {}

    def _quoted(self, path):
        if path not in self.includes:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    self.includes[path] = INCLUDE_RE.findall(f.read())
            except OSError:
                self.includes[path] = []
        return self.includes[path]

    def reaches_marker(self, source, dirs):
        seen, stack = set(), [source]
        while stack:
            path = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            for name in self._quoted(path):
                if name.endswith(MARKER) or name == "longhaul/base/mutex.h":
                    return True
                for d in [os.path.dirname(path)] + dirs:
                    candidate = os.path.normpath(os.path.join(d, name))
                    if candidate.startswith(ROOT) and "/build/" not in candidate[len(ROOT):] \
                            and os.path.isfile(candidate):
                        stack.append(candidate)
                        break
        return False


def run(command, directory):
    started = time.monotonic()
    proc = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def self_test_command(template, source):
    """A command for a self-test source with the includes and flags of a base translation unit."""
    command = [a for a in template["command"] if a != template["file"]]
    return command + [source]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir", help="a configured and built build folder (build/ci)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--clang", default=os.environ.get("CLANGXX", "clang++"))
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--all", action="store_true",
                        help="check every translation unit, also those without annotations")
    opts = parser.parse_args()

    database = os.path.join(opts.build_dir, "compile_commands.json")
    clangxx = shutil.which(opts.clang)
    if not os.path.isfile(database):
        print(f"check-thread-safety: {database} not found: configure with `cmake --preset ci` "
              "(CMAKE_EXPORT_COMPILE_COMMANDS is on) and build first", file=sys.stderr)
        return 2
    if not clangxx:
        print(f"check-thread-safety: {opts.clang} not found: run scripts/install-deps.sh "
              "(Debian package clang)", file=sys.stderr)
        return 2
    with open(database) as f:
        entries = json.load(f)

    scanner = IncludeScanner()
    jobs, skipped, template = [], 0, None
    for entry in entries:
        source = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        if not source.endswith(".cc"):
            continue
        command = clang_arguments(entry, clangxx)
        job = {"file": source, "command": command, "directory": entry["directory"]}
        if template is None and "/base/" in source:
            template = job
        if opts.all or scanner.reaches_marker(source, include_dirs(command, entry["directory"])):
            jobs.append(job)
        else:
            skipped += 1
    if template is None:
        print("check-thread-safety: no longhaul::base translation unit in the database",
              file=sys.stderr)
        return 2

    started = time.monotonic()
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        futures = {pool.submit(run, j["command"], j["directory"]): j for j in jobs}
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            rc, output, seconds = future.result()
            if opts.verbose:
                print(f"  {seconds:5.1f}s {os.path.relpath(job['file'], ROOT)}")
            if rc != 0:
                failures.append((job["file"], output))
    for source, output in sorted(failures):
        print(f"--- {os.path.relpath(source, ROOT)}\n{output}", end="")

    # Self-tests: the check must catch an unguarded read and accept the documented lock patterns.
    here = os.path.join(ROOT, "tests", "thread_safety")
    self_failures = []
    rc, output, _ = run(self_test_command(template, os.path.join(here, "unguarded_read.cc")),
                        template["directory"])
    if rc == 0 or "requires holding mutex" not in output:
        self_failures.append("tests/thread_safety/unguarded_read.cc reads a GUARDED_BY field "
                             "without its lock but the check did not fail on it:\n" + output)
    rc, output, _ = run(self_test_command(template, os.path.join(here, "guarded_ok.cc")),
                        template["directory"])
    if rc != 0:
        self_failures.append("tests/thread_safety/guarded_ok.cc holds its locks correctly but "
                             "the check failed on it:\n" + output)
    for message in self_failures:
        print("check-thread-safety: self-test failed: " + message)

    elapsed = time.monotonic() - started
    print(f"check-thread-safety: {len(jobs)} translation units checked with {clangxx} "
          f"-Wthread-safety ({skipped} include no annotations, skipped), {len(failures)} with "
          f"errors, self-tests {'failed' if self_failures else 'passed'}, {elapsed:.0f}s on "
          f"{opts.jobs} jobs")
    return 1 if failures or self_failures else 0


if __name__ == "__main__":
    sys.exit(main())

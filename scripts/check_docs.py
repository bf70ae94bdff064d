#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when README.md or docs/*.md name a pmt entity, a file or a command-line flag that does
not exist. It reads the inline code spans (`...`) of each document:

  pmt::a::B, pmt::B::member   the last name (and the class before a member) must be declared in
                              include/pmt (a class, struct, enum, alias, function or variable)
  a/path.hpp, scripts/x.sh    a path with an extension must exist, from the project root or from
                              include/ or include/pmt/ (headers are named as pmt/nn/gpt.hpp or
                              nn/gpt.hpp), or under the directory the document names it beside
  Gpt<..., Hybrid<...> ...>   a model given a policy (it is Gpt<T, Exec, Backend>)
  --flag                      must be spelt in a program, script or test of the project (train_gpt,
                              pmt-plan, the examples, the benchmarks, scripts) — or be one of the
                              tools' own flags listed below (mpiexec, ctest, cmake, Kokkos)

  scripts/check_docs.py [FILE ...]   (default: README.md docs/*.md); exit 1 naming what is missing
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# flags of other tools that the docs show in command lines
FOREIGN_FLAGS = {
    "--oversubscribe", "--bind-to", "--map-by", "--rankfile", "--output-on-failure", "--timeout",
    "--preset", "--build", "--target", "--parallel", "--rerun-failed", "--help", "--version",
    "--distribution", "--ntasks-per-node", "--nodes", "--ntasks", "--cpu-bind", "--mca", "--hostfile",
    "--host", "--np", "--allow-run-as-root", "--show-progress", "--test-dir", "--label-regex",
    "--output-junit", "--install", "--prefix", "--config", "--schedule-random", "--repeat",
    "--user", "--upgrade", "--break-system-packages", "--index-url", "--quiet", "--no-deps",
    "--download-only", "--reorder", "--list-tests", "--reporter", "--durations", "--fresh",
}


def declared_names():
    """Every name declared in include/pmt and the tests' helpers (pmt::test): types, aliases,
    functions, variables, enumerators, members; and the instrumented regions' labels."""
    names = set()
    paths = glob.glob(os.path.join(ROOT, "include", "pmt", "**", "*.hpp"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "tests", "**", "*.hpp"), recursive=True)
    for path in paths:
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"//[^\n]*", "", text)
        for m in re.finditer(r"\b(?:class|struct|enum class|enum|using|namespace)\s+(\w+)", text):
            names.add(m.group(1))
        for m in re.finditer(r"\b(\w+)\s*\(", text):  # functions, constructors, macros
            names.add(m.group(1))
        for m in re.finditer(r"\b(\w+)\s*(?:=|;|\{|,|\))", text):  # variables, members, enumerators
            names.add(m.group(1))
        for m in re.finditer(r"#define\s+(\w+)", text):
            names.add(m.group(1))
        for m in re.finditer(r'"pmt::([\w:]+)', open(path, encoding="utf-8").read()):  # region labels
            names.update(m.group(1).split("::"))
    return names


def spelt_flags():
    """Every --flag written in the project's programs, scripts and tests."""
    flags = set()
    patterns = ["examples/*.cpp", "bench/*.cpp", "bench/*.py", "bench/*.sh", "scripts/*", "tests/**/*.cpp",
                "tests/**/*.cmake", "tests/**/*.txt", "CMakeLists.txt", "cmake/*", ".ci/*", "include/pmt/**/*.hpp"]
    for pat in patterns:
        for path in glob.glob(os.path.join(ROOT, pat), recursive=True):
            if os.path.isfile(path):
                try:
                    text = open(path, encoding="utf-8").read()
                except UnicodeDecodeError:
                    continue
                flags.update(re.findall(r"--[a-z][a-z0-9-]*", text))
    return flags


def path_exists(span, doc):
    span = span.split(":")[0].split("#")[0].rstrip("/")
    if "*" in span or "<" in span or "{" in span or span.startswith(("~", "/", "$", "http")):
        return True  # a pattern or a place outside the project
    bases = [ROOT, os.path.join(ROOT, "include"), os.path.join(ROOT, "include", "pmt"), os.path.dirname(doc)]
    bases += [os.path.join(ROOT, d) for d in ("bench", "examples", "scripts", "tests", "docs", "build")]
    if span.startswith("build/"):
        return True  # build outputs
    if any(os.path.exists(os.path.join(b, span)) for b in bases):
        return True
    # a bare file name (a table of one directory's headers): a file of that name in the project
    return "/" not in span and bool(glob.glob(os.path.join(ROOT, "**", span), recursive=True))


def slug(heading):
    """The anchor a Markdown renderer gives a heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file's headings (outside code blocks)."""
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


LINK = re.compile(r"\]\(([^)\s]*)#([^)\s]+)\)")


MODEL_WITH_POLICY = re.compile(r"\bGpt<([^<>]|<[^<>]*(<[^<>]*>)?[^<>]*>)*?\b(Hybrid|DataParallel|TensorSplit|Pipeline)<")
PATH = re.compile(r"^[\w./-]+\.(hpp|cpp|py|sh|md|cmake|json|txt|supp)$")
ENTITY = re.compile(r"\bpmt::((?:\w+::)*\w+)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def check(files):
    names, flags = declared_names(), spelt_flags()
    problems = []
    for doc in files:
        text = open(doc, encoding="utf-8").read()
        text = re.sub(r"```.*?```", lambda m: m.group(0).replace("`", ""), text, flags=re.S)  # blocks: flags only
        rel = os.path.relpath(doc, ROOT)
        spans = re.findall(r"`([^`\n]+)`", text)
        for span in spans:
            for m in ENTITY.finditer(span):
                parts = [p for p in m.group(1).split("::") if p]
                # pmt::ns::Name or pmt::Name::member: every part after the namespaces must exist
                for part in parts:
                    if part not in names:
                        problems.append(f"{rel}: `{span}` names pmt::{m.group(1)}, and `{part}` is declared nowhere in include/pmt")
                        break
            s = span.strip()
            if PATH.match(s) and not path_exists(s, doc):
                problems.append(f"{rel}: `{span}` is not a file of the project")
        # links to a heading of a Markdown file: the heading exists
        for target, anchor in LINK.findall(open(doc, encoding="utf-8").read()):
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
            if path.endswith(".md") and os.path.isfile(path) and anchor not in anchors(path):
                problems.append(f"{rel}: link to {target or rel}#{anchor}: no such heading there")
        # a model type given a policy: models are Gpt<T, Exec, Backend>; policies go to the Trainer
        for m in MODEL_WITH_POLICY.finditer(open(doc, encoding="utf-8").read()):
            problems.append(f"{rel}: `{m.group(0)}...` gives Gpt a policy; it is Gpt<T, Exec, Backend> (the Trainer takes the policy)")
        # flags anywhere in the document's code (spans and blocks)
        for span in spans + re.findall(r"```.*?```", open(doc, encoding="utf-8").read(), flags=re.S):
            for f in FLAG.findall(span):
                if f.startswith("--kokkos") or f in FOREIGN_FLAGS or f in flags:
                    continue
                problems.append(f"{rel}: flag {f} is spelt nowhere in the project's programs")
    return sorted(set(problems))


def main():
    files = sys.argv[1:] or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    problems = check(files)
    for p in problems:
        print(p)
    print(f"check_docs: {len(files)} documents, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

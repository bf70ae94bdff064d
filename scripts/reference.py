#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/reference.md from the headers: every public entity at namespace scope of pmt (classes,
structs, enums, aliases, functions and variables outside detail namespaces), grouped by header,
with its declaration and its doc comment (the /// lines above it: what it does, shapes,
placements, what it throws), and the public members of each class with their own comments.

  scripts/reference.py            writes docs/reference.md
  scripts/reference.py --check    fails (exit 1) when docs/reference.md is not what the headers
                                  give, or when a public entity has no doc comment; names them
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include")
OUT = os.path.join(ROOT, "docs", "reference.md")

DECL = re.compile(r"^(template\s*<.*>\s*)?(inline\s+|constexpr\s+|static\s+)*"
                  r"(?P<kind>class|struct|enum class|enum|using|[\w:<>,\s\*&]+?)\s*(?P<name>[A-Za-z_]\w*)\b")


def strip_comment(line):
    i = line.find("//")
    return line if i < 0 else line[:i]


def declarations(path):
    """(namespace, declaration, doc lines, members) of the public namespace-scope entities."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, ns_stack, depth, doc, i = [], [], 0, [], 0  # ns_stack: (names, depth inside it)
    last_end = -2  # the line the previous entity ended on: one right below shares its comment
    while i < len(lines):
        line = lines[i].strip()
        code = strip_comment(lines[i])
        at_ns_scope = depth == (ns_stack[-1][1] if ns_stack else 0)
        names = [n for names_, _ in ns_stack for n in names_]
        public = bool(names) and names[0] == "pmt" and not any("detail" in n for n in names)
        if line.startswith("///"):
            doc.append(line[3:].strip())
            i += 1
            continue
        m = re.match(r"namespace\s+([\w:]+)\s*\{", line)
        if m and at_ns_scope:
            depth += 1
            ns_stack.append((m.group(1).split("::"), depth))
            doc = []
            i += 1
            continue
        if at_ns_scope and public and line and not line.startswith(("#", "//", "}")):
            text, j = "", i
            while j < len(lines):
                part = strip_comment(lines[j]).strip()
                text += " " + part
                if "{" in part.replace("{}", "") or part.endswith(";"):
                    break
                j += 1
            text = re.sub(r"\s+", " ", text).strip()
            head = text.replace("{}", "\x00").split("{")[0].replace("\x00", "{}").strip().rstrip(";").strip()
            if head and not head.startswith(("static_assert", "extern", "KOKKOS_")) or head.startswith("KOKKOS_INLINE"):
                members = []
                if re.match(r"(template\s*<.*?>\s*)?(class|struct)\s", head) and "{" in text:
                    members = class_members(lines, j)
                if not doc and last_end == i - 1 and out:
                    doc = ["(as above)"]
                out.append(("::".join(names), head, doc, members))
            doc = []
            d, k, started = 0, i, False
            while k < len(lines):
                c = strip_comment(lines[k]).replace("{}", "")
                d += c.count("{") - c.count("}")
                started = started or "{" in c
                if (started and d <= 0) or (not started and c.rstrip().endswith(";")):
                    break
                k += 1
            last_end = k
            i = k + 1
            continue
        doc = []
        depth += code.count("{") - code.count("}")
        while ns_stack and depth < ns_stack[-1][1]:
            ns_stack.pop()
        i += 1
    return out


def class_members(lines, start):
    """Public member declarations (one line each, with their /// comments) of the class opening
    at line `start`."""
    members, doc, depth, access = [], [], 0, None
    first = True
    k = start
    while k < len(lines):
        raw = lines[k]
        line = raw.strip()
        code = strip_comment(raw)
        if first:
            access = "private" if re.search(r"\bclass\b", code) else "public"
            depth += code.count("{") - code.count("}")
            first = False
            k += 1
            continue
        if depth == 1:
            if re.match(r"(public|private|protected)\s*:", line):
                access = line.split(":")[0]
                doc = []
            elif line.startswith("///"):
                doc.append(line[3:].strip())
            elif access == "public" and line and not line.startswith("//") and not line.startswith("#") \
                    and not line.startswith("}") and not line.startswith("static_assert"):
                text = re.sub(r"\s+", " ", code.split("{")[0]).strip().rstrip(";").rstrip(":").strip()
                if text and not text.startswith(":") and not text.startswith(","):
                    members.append((text, doc))
                doc = []
            elif not line.startswith("///"):
                doc = []
        depth += code.count("{") - code.count("}")
        if depth <= 0:
            break
        k += 1
    return members


def prose(doc):
    """A comment's lines as one paragraph: code examples dropped, \\brief / \\throws / \\param spelt out."""
    keep, code = [], False
    for d in doc:
        if d.startswith("\\code"):
            code = True
        elif d.startswith("\\endcode"):
            code = False
        elif not code:
            keep.append(d)
    text = " ".join(keep)
    text = text.replace("\\brief ", "").replace("\\throws ", "Throws ").replace("\\return ", "Returns ")
    text = re.sub(r"\\param (\w+)", r"`\1`:", text)
    text = re.sub(r"\\tparam (\w+)", r"`\1`:", text)
    return text


def render():
    files = []
    for d, _, names in os.walk(os.path.join(INCLUDE, "pmt")):
        for n in names:
            if n.endswith(".hpp") and "/detail" not in d.replace("\\", "/"):
                files.append(os.path.join(d, n))
    files.sort()
    missing = []
    out = ["# Reference", "",
           "Every public entity of pmt at namespace scope, by header: its declaration, what its comment",
           "says (shapes, placements, errors), and the public members of classes. Generated from the",
           "headers by `scripts/reference.py`; the suite checks that it is current and that every entity",
           "has a comment (`docs_reference_is_current`). Legend and conventions: [design.md](design.md).", ""]
    for f in files:
        rel = os.path.relpath(f, INCLUDE).replace("\\", "/")
        decls = declarations(f)
        if not decls:
            continue
        out += [f"## `{rel}`", ""]
        for ns, head, doc, members in decls:
            name = head
            out.append(f"- `{ns}`: `{head}`")
            if doc:
                out.append("  " + prose(doc))
            else:
                missing.append(f"{rel}: {head}")
            for text, mdoc in members:
                line = f"  - `{text}`"
                if mdoc:
                    line += ": " + prose(mdoc)
                out.append(line)
        out.append("")
    return "\n".join(out).rstrip() + "\n", missing


def main():
    text, missing = render()
    if "--check" in sys.argv:
        ok = True
        current = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if current != text:
            print("docs/reference.md is not what the headers give: run scripts/reference.py")
            ok = False
        for m in missing:
            print("no doc comment:", m)
        return 0 if ok and not missing else 1
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    for m in missing:
        print("no doc comment:", m)
    print(f"docs/reference.md written; {len(missing)} entities without a doc comment")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a C++ file holding every ```cpp block of README.md as a function, so that the README's
code is compiled (and run, by test_readme.cpp) against the library exactly as a reader would use it.

Usage: extract_readme.py README.md OUT.cpp

Note [README blocks]
A block is a fragment: its #include lines, then statements at the level of a function body that
use a few names the reader supplies (a weight size, an init buffer, their own GEMM). Each block
becomes `readme::outcome block_N(const readme::stand_ins& in)`:
  * its #include lines go to the top of the file; the file includes nothing else of Spillway's
    except readme_stand_ins.hpp, which includes only offload/swap_policy.hpp, so a name the
    public header does not make reachable is a compile error;
  * each stand-in the block uses (STAND_INS below, the one list of them) is bound to the field of
    `in` with its name, so the README reads as written;
  * a block that opens a `spillway::Session NAME` hands back NAME's reports and recorded trace.
Anything else a block uses must be declared by the block itself, or the build of the test fails,
which is the point: the README's code must compile against the current API.
"""
import os
import re
import sys

# The names the README leaves to the reader, each a field of readme::stand_ins.
STAND_INS = ["w_bytes", "x_bytes", "y_bytes", "w_init", "batch", "steps", "my_gemm"]


def blocks_of(text):
    """(line of the opening fence, lines of the block) for every ```cpp block."""
    out, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), start=1):
        fence = line.strip()
        if current is None and fence == "```cpp":
            current, start = [], number
        elif current is not None and fence == "```":
            out.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        sys.exit(f"README.md:{start}: a ```cpp block is not closed")
    return out


def function_of(index, start, lines):
    includes = [l.strip() for l in lines if l.strip().startswith("#include")]
    body = [l for l in lines if not l.strip().startswith("#include")]
    code = "\n".join(body)
    used = [n for n in STAND_INS if re.search(r"\b" + n + r"\b", code)]
    session = re.search(r"\bspillway::Session\s+(\w+)\s*[({]", code)
    fn = [f"// README.md:{start}", f"outcome block_{index}([[maybe_unused]] const stand_ins& in) {{"]
    fn += [f"  const auto& {n} = in.{n};" for n in used]
    fn += [f"#line {start + 1} \"README.md\""] + ["  " + l if l else "" for l in body]
    fn.append("#line @RESET@")
    if session:
        name = session.group(1)
        fn.append(f"  return outcome{{true, {name}.history(), {name}.recorded_trace()}};")
    else:
        fn.append("  return outcome{};")
    fn.append("}")
    return includes, fn


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: extract_readme.py README.md OUT.cpp")
    with open(sys.argv[1], encoding="utf-8") as f:
        found = blocks_of(f.read())
    if not found:
        sys.exit(f"{sys.argv[1]}: no ```cpp block to compile")
    includes, functions, table = [], [], []
    for i, (start, lines) in enumerate(found, start=1):
        inc, fn = function_of(i, start, lines)
        includes += [x for x in inc if x not in includes]
        functions += fn + [""]
        table.append(f'    {{"README.md:{start}", &block_{i}}},')
    out = ["// Generated from README.md by tests/readme/extract_readme.py (Note [README blocks]); do not edit.",
           *includes, '#include "readme_stand_ins.hpp"', "",
           "// The README's fragments name values they do not use again (a report, a gradient).",
           '#pragma GCC diagnostic ignored "-Wunused-variable"',
           '#pragma GCC diagnostic ignored "-Wunused-but-set-variable"', "",
           "namespace readme {", "namespace {", "",
           *functions, "}  // namespace", "", "const std::vector<block> blocks = {", *table, "};", "",
           "}  // namespace readme", ""]
    # Lines after a block are the generated file's own again, for messages about them.
    name = os.path.basename(sys.argv[2])
    out = [f'#line {i + 2} "{name}"' if line == "#line @RESET@" else line for i, line in enumerate(out)]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()

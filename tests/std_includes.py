#!/usr/bin/env python3
"""Each source file includes the standard headers whose names it uses, itself or through a
project header it includes, never only through another standard header: GCC 13 and 14 stopped
including <cstdint>, <algorithm> and others from headers that had brought them in, so a file
that built with GCC 12 by luck stops building there.

    std_includes.py SOURCE_ROOT    exits 1 and names file, name and header for each miss
"""
import os
import re
import sys

# header: pattern of names it declares (the common ones), and headers that also declare them.
CHECKS = {
    "cstdint": (r"\b(std::)?u?int(8|16|32|64)_t\b|\b(std::)?uintptr_t\b", {"stdint.h", "cuda_runtime.h", "cuda.h", "mpi.h", "liburing.h", "numa.h"}),
    "algorithm": (r"std::(sort|stable_sort|min_element|max_element|find_if|find|any_of|all_of|none_of|count_if|remove_if|reverse|fill|lower_bound|upper_bound|clamp|unique|transform|copy_if|max|min|equal|partial_sort|nth_element)\b(?!_)", {"ranges"}),
    "memory": (r"std::(unique_ptr|shared_ptr|make_unique|make_shared|weak_ptr)\b", set()),
    "functional": (r"std::function<", set()),
    "optional": (r"std::optional<|std::nullopt\b", set()),
    "array": (r"std::array<", set()),
    "stdexcept": (r"std::(runtime_error|logic_error|invalid_argument|out_of_range)\b", set()),
    "sstream": (r"std::(ostringstream|istringstream|stringstream)\b", set()),
    "numeric": (r"std::(accumulate|iota|partial_sum|reduce|inner_product)\b", set()),
    "string_view": (r"std::string_view\b", {"string"}),
    "cmath": (r"std::(sqrt|exp|log|pow|isfinite|fabs|ceil|floor)\(", {"math.h"}),
    "limits": (r"std::numeric_limits<", set()),
    "atomic": (r"std::atomic<", set()),
    "mutex": (r"std::(mutex|lock_guard|unique_lock|scoped_lock)\b", {"condition_variable"}),
    "thread": (r"std::thread\b", set()),
    "chrono": (r"std::chrono::", set()),
    "map": (r"std::map<", set()),
    "unordered_map": (r"std::unordered_map<", set()),
    "set": (r"std::set<", set()),
    "unordered_set": (r"std::unordered_set<", set()),
    "variant": (r"std::(variant<|visit\(|get_if<)", set()),
    "tuple": (r"std::(tuple<|tie\(|make_tuple\()", set()),
    "cstring": (r"std::(memcpy|memset|memcmp|strlen|strerror)\(", {"string.h"}),
    "deque": (r"std::deque<", set()),
    "span": (r"std::span<", set()),
    "filesystem": (r"std::filesystem::", set()),
    "random": (r"std::(mt19937|uniform_int_distribution|uniform_real_distribution|normal_distribution)", set()),
    "fstream": (r"std::(ofstream|ifstream|fstream)\b", set()),
    "iostream": (r"std::(cout|cerr)\b", set()),
    "queue": (r"std::(priority_queue|queue)<", set()),
    "exception": (r"std::(exception_ptr|current_exception|rethrow_exception|make_exception_ptr)\b", {"stdexcept"}),
    "cstdio": (r"std::(snprintf|fprintf|printf|fopen|fclose|fputs)\(", {"stdio.h"}),
    "cstdlib": (r"std::(getenv|abort|exit|strtoull|strtoul|strtol|system)\(", {"stdlib.h"}),
    "charconv": (r"std::(from_chars|to_chars)\(", set()),
}
SOURCES = (".hpp", ".cpp", ".h", ".cuh")
SKIP = {"build", ".git", "subprojects"}


def main(root):
    files = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP and not x.startswith(".")]
        for n in names:
            if n.endswith(SOURCES):
                p = os.path.relpath(os.path.join(d, n), root)
                text = open(os.path.join(root, p), errors="replace").read()
                files[p] = (re.findall(r'#include\s+"([^"]+)"', text), set(re.findall(r"#include\s+<([^>]+)>", text)),
                            re.sub(r"//[^\n]*", "", text))

    def resolve(f, h):
        for c in (h, os.path.normpath(os.path.join(os.path.dirname(f), h))):
            if c in files:
                return c
        return None

    def closure(f):
        seen, std, todo = set(), set(), [f]
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            quoted, angled, _ = files[g]
            std |= angled
            todo += [r for r in (resolve(g, h) for h in quoted) if r]
        return std

    misses = []
    for f in sorted(files):
        body, have = files[f][2], None
        for header, (pattern, also) in CHECKS.items():
            m = re.search(pattern, body)
            if not m:
                continue
            have = have if have is not None else closure(f)
            if not ({header} | also) & have:
                misses.append(f"{f}: uses {m.group(0).rstrip('(<')} but includes no <{header}> (itself or through a project header)")
    for m in misses:
        print(m)
    print(f"std_includes: {len(files)} files, {len(misses)} missing includes")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

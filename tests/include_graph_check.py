#!/usr/bin/env python3
"""The floors of the house, read off the include graph: every #include of the library's sources resolved to the
folder it lands in, and each floor allowed to include only the floors below it:

    examples/, tools/, frontends/   (anything)
    sim/                            training/, comm/ (its internals too), topology/, compression/, common/
    training/                       comm/ (public headers), topology/, compression/, common/
    comm/                           topology/, compression/, common/
    topology/, compression/         common/
    common/                         itself

Prints the floor-to-floor counts and fails naming each include that points up or sideways.
Usage: include_graph_check.py [REPO_ROOT]"""
import collections
import os
import re
import sys

FLOORS = ["common", "topology", "compression", "comm", "training", "sim"]
ALLOWED = {
    "common": {"common"},
    "topology": {"common", "topology"},
    "compression": {"common", "compression"},
    "comm": {"common", "topology", "compression", "comm"},
    "training": {"common", "topology", "compression", "comm", "training"},
    "sim": {"common", "topology", "compression", "comm", "training", "sim"},
}
SOURCE = re.compile(r"\.(h|hpp|cpp|cu|cuh|inc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def floor_of(root, path):
    rel = os.path.relpath(path, root)
    top = rel.split(os.sep)[0]
    return top if top in FLOORS else None


def resolve(root, including, name):
    """The file an #include "name" finds: beside the includer, in a floor's include/ or (for sim's private
    includes and the tests') in a floor's src/."""
    candidates = [os.path.join(os.path.dirname(including), name)]
    candidates += [os.path.join(root, f, "include", name) for f in FLOORS]
    candidates += [os.path.join(root, f, "src", name) for f in FLOORS]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.normpath(c)
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    counts = collections.Counter()
    wrong = []
    files = 0
    for floor in FLOORS:
        for dirpath, _, names in os.walk(os.path.join(root, floor)):
            for n in names:
                if not SOURCE.search(n):
                    continue
                path = os.path.join(dirpath, n)
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for name in INCLUDE.findall(text):
                    target = resolve(root, path, name)
                    if target is None:
                        continue  # a third-party or generated header
                    to = floor_of(root, target)
                    if to is None:
                        continue
                    counts[(floor, to)] += 1
                    private = os.sep + "src" + os.sep in os.path.relpath(target, root)
                    bad = to not in ALLOWED[floor]
                    # training/ uses comm/ through its public headers only; sim/ may reuse comm's internals.
                    bad = bad or (floor == "training" and to == "comm" and private)
                    if bad:
                        wrong.append(f"{os.path.relpath(path, root)}: #include \"{name}\" reaches "
                                     f"{os.path.relpath(target, root)} ({floor}/ may include only "
                                     f"{', '.join(sorted(ALLOWED[floor]))}" +
                                     (", and comm/'s public headers" if floor == "training" else "") + ")")
    if files == 0:
        print(f"include_graph_check: no sources under {root}", file=sys.stderr)
        return 2
    print(f"{files} files; includes between floors (from -> to: count):")
    for (a, b), c in sorted(counts.items(), key=lambda kv: (FLOORS.index(kv[0][0]), FLOORS.index(kv[0][1]))):
        if a != b:
            print(f"  {a:12s} -> {b:12s} {c}")
    if wrong:
        print(f"{len(wrong)} include(s) point up or sideways:", file=sys.stderr)
        for w in wrong:
            print("  " + w, file=sys.stderr)
        return 1
    print("every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

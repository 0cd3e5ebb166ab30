#!/usr/bin/env python3
"""The layering, checked on the #include lines before anything compiles.

    check_layering.py LAYERING_TXT SOURCE_ROOT

LAYERING_TXT is written by src/CMakeLists.txt from the libraries' links: one line per room (a folder
of src/ built as one library vq_<room>), "room: rooms it links". A file of src/<room>/ may include
headers of its own room and of every room it links, directly or through others; the public headers
(include/veloxquant) include no internal header; tools/, bench/ and python/ may include any room.
Nothing climbs out with "..", and every folder of src/ is a declared room. Each violation is one line
naming the file, the line, the header and both rooms; the exit status is 1 when there is any."""
import re
import sys
from pathlib import Path

SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TOP = ("tools", "bench", "python")


def read_rooms(text):
    """{room: set of rooms it links directly} from the lines "room: dep dep"."""
    rooms = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        room, _, deps = line.partition(":")
        rooms[room.strip()] = set(deps.split())
    return rooms


def reachable(rooms):
    """{room: every room it may include}: itself and its links' closure."""
    out = {}
    for r in rooms:
        seen, todo = {r}, [r]
        while todo:
            for d in rooms.get(todo.pop(), ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        out[r] = seen
    return out


def violations(root, rooms):
    allowed = reachable(rooms)
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in SOURCES or rel.parts[0] not in ("src", "include") + TOP:
            continue
        if rel.parts[0] == "src" and len(rel.parts) > 2 and rel.parts[1] not in rooms:
            found.append(f"{rel}: src/{rel.parts[1]} is not a room of src/CMakeLists.txt (add it there with its links)")
            continue
        src = rel.parts[1] if rel.parts[0] == "src" and len(rel.parts) > 2 else rel.parts[0]
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            name = m.group(2)
            if ".." in name.split("/"):
                found.append(f"{rel}:{no}: '{name}' climbs out of its directory")
                continue
            head = name.split("/")[0]
            if "/" not in name or (head not in rooms and head != "veloxquant"):
                continue  # system, same-directory and tool headers
            if src == "include":
                if head != "veloxquant":
                    found.append(f"{rel}:{no}: the public header includes internal '{name}' ({head})")
            elif src in rooms and head != "veloxquant" and head not in allowed[src]:
                found.append(f"{rel}:{no}: {src} includes '{name}' from {head}, a room it does not link "
                             f"(vq_{src} links: {', '.join(sorted(allowed[src] - {src})) or 'nothing'})")
    return found


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    v = violations(Path(argv[2]), read_rooms(Path(argv[1]).read_text()))
    for line in v:
        print(f"layering: {line}", file=sys.stderr)
    return 1 if v else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

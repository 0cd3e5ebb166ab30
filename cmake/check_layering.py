#!/usr/bin/env python3
"""The layering, checked on the #include lines before anything compiles.

    check_layering.py LAYERING_TXT SOURCE_ROOT

LAYERING_TXT is written by src/CMakeLists.txt from the libraries' links: one line per room (a folder
of src/ built as one library vq_<room>), "room: rooms it links". A file of src/<room>/ may include
headers of its own room and of every room it links, directly or through others; the public headers
(include/veloxquant) include no internal header; tools/, bench/ and python/ may include any room,
except the CLI (tools/veloxquant), which stands on the public API: it includes include/veloxquant
headers, its own, and only the internal headers CLI_ALLOWED names (each with the reason it must).
Nothing climbs out with "..", and every folder of src/ is a declared room. Each violation is one line
naming the file, the line, the header and both rooms; the exit status is 1 when there is any."""
import re
import sys
from pathlib import Path

SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TOP = ("tools", "bench", "python")

# The CLI's internal includes, and why each must stay (issue 19 item 4: the CLI is built on the
# public API). Keys: a header, or a folder ending in "/" for every header under it; values: the
# CLI files (names in tools/veloxquant) that may include it, "*" for all, and the reason.
CLI = "tools/veloxquant"
CLI_ALLOWED = {
    # Formatting helpers that throw the public error type (veloxquant::Error is vq::Error, status.h).
    "core/error.h": ("*", "VQ_CHECK/VQ_FAIL build the one-line messages; they throw the public vq::Error"),
    # Terminal and input hygiene of a command-line program, no library state.
    "core/text_escape.h": ("*", "control characters of model text and file names escaped on a terminal"),
    "core/input_file.h": (("cmd_generate.cpp",), "prompt files read with a size bound, named by the flag"),
    "core/int_list.h": ("*", "integer options and lists (1,4,8) checked whole, the flag named in the error"),
    # -m NAME: the CLI fetches known models from PyPI on first use; the library never downloads.
    "model/known_models.h": (("cli_model.h",), "the known models' table (names, packages, checksums)"),
    "model_fetch/model_fetch.h": (("cli_model.h",), "downloads a known model on first use"),
    # `bench e2e` times the KV store's append path, forks and one batched Forward::step on hand-made
    # sequences, internals on purpose (the comment at the top of each file says why).
    "eval/calibrate.h": (("bench_e2e.cpp",), "first-use calibration of the internal spec it times"),
    "model/session.h": (("bench_e2e.cpp", "bench_e2e_device.cpp"), "the internal model, store and forward it times"),
    "model/": (("bench_e2e_device.cpp",), "a device model of random weights for a geometry"),
    "kvcache/": (("bench_e2e_device.cpp",), "the device KV store filled directly"),
    "ops/cuda/": (("bench_e2e_device.cpp",), "device memory, streams and the copy bandwidth it measures"),
    "core/": (("bench_e2e_device.cpp",), "atomic output and the device tuning overrides it reports"),
}


def cli_allows(file_name, header):
    """Whether CLI file file_name may include the internal header (CLI_ALLOWED)."""
    for key, (files, _why) in CLI_ALLOWED.items():
        if (header == key or (key.endswith("/") and header.startswith(key))) and (files == "*" or file_name in files):
            return True
    return False


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
            if rel.parent.as_posix() == CLI and m.group(1) == '"' and "/" in name and head != "veloxquant":
                if not cli_allows(rel.name, name):
                    found.append(f"{rel}:{no}: the CLI includes internal '{name}': use include/veloxquant, or add it "
                                 f"to CLI_ALLOWED in cmake/check_layering.py with the reason it must stay")
                continue
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

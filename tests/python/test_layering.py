"""The layering of DESIGN.md, checked on the #include lines: each layer includes only headers of
its own layer and the layers below it,

    core < ops (ref, cpu, cuda) < codec < kvcache < model < engine < server < tools, bench, python

and the public headers (include/veloxquant) include no internal header at all. A violation fails
naming the file, the line and both layers."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["core", "ops", "codec", "kvcache", "model", "engine", "server"]
TOP = len(LAYERS)  # tools/, bench/, python/: may include any layer
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of_file(rel):
    """Layer index of a file (path relative to the root), "public" for include/, None elsewhere."""
    parts = rel.parts
    if parts[0] == "include":
        return "public"
    if parts[0] == "src" and len(parts) > 2 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if parts[0] in ("tools", "bench", "python"):
        return TOP
    return None


def layer_of_include(name):
    """Layer index of an included project header ("codec/x.h"), "public" for veloxquant/...,
    None for system and same-directory headers."""
    head = name.split("/")[0]
    if head in LAYERS:
        return LAYERS.index(head)
    if head == "veloxquant":
        return "public"
    return None


def layer_name(i):
    return i if isinstance(i, str) else (LAYERS[i] if i < TOP else "tools")


def violations(root):
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in SOURCES or rel.parts[0] in ("build", ".venv", ".git"):
            continue
        src = layer_of_file(rel)
        if src is None:
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            name = m.group(2)
            if ".." in name.split("/"):
                found.append(f"{rel}:{no}: '{name}' climbs out of its directory")
                continue
            inc = layer_of_include(name)
            if inc is None:
                continue
            if src == "public":
                if inc != "public":
                    found.append(f"{rel}:{no}: the public header includes internal '{name}' ({layer_name(inc)})")
            elif inc != "public" and inc > src:
                found.append(f"{rel}:{no}: {layer_name(src)} includes '{name}' from {layer_name(inc)}, a layer above it")
    return found


def test_the_tree_follows_the_layering():
    v = violations(ROOT)
    assert not v, "layering violations:\n" + "\n".join(v)


def test_the_check_catches_each_kind(tmp_path):
    files = {
        "src/ops/cpu/pq.cpp": '#include "codec/product_quantizer.h"\n#include "core/error.h"\n',
        "src/core/x.h": '#include "kvcache/factory.h"\n',
        "src/codec/ok.cpp": '#include "ops/ref/pq.h"\n#include "veloxquant/status.h"\n#include <vector>\n',
        "include/veloxquant/api.h": '#include "model/model.h"\n#include "veloxquant/status.h"\n',
        "src/model/up.cpp": '#include "../engine/pool.h"\n',
        "tools/veloxquant/main.cpp": '#include "server/http.h"\n',
    }
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    v = violations(tmp_path)
    assert len(v) == 4, v
    assert v[0].startswith("include/veloxquant/api.h:1: the public header includes internal 'model/model.h'")
    assert "src/core/x.h:1: core includes 'kvcache/factory.h' from kvcache" in v[1]
    assert "src/model/up.cpp:1: '../engine/pool.h' climbs out" in v[2]
    assert "src/ops/cpu/pq.cpp:1: ops includes 'codec/product_quantizer.h' from codec, a layer above it" in v[3]

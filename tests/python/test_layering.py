"""The layering (cmake/check_layering.py, run by the build before anything compiles): on the tree, with
the rooms the build declared (VQ_BUILD_DIR/layering.txt), and on a made-up tree where each kind of
violation must be caught."""
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_layering", ROOT / "cmake" / "check_layering.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def build_rooms():
    build = Path(os.environ.get("VQ_BUILD_DIR", ROOT / "build" / "release"))
    f = build / "layering.txt"
    assert f.exists(), f"{f} is missing: configure the build first (src/CMakeLists.txt writes it)"
    return check.read_rooms(f.read_text())


def test_the_rooms_are_the_ones_the_build_links():
    rooms = build_rooms()
    assert rooms["core"] == set()
    assert rooms["text"] == {"core"}, "text must stay free of the model and of GGUF"
    assert {"kvcache", "text"} <= rooms["model"]
    assert rooms["eval"] == {"model"}
    allowed = check.reachable(rooms)
    assert "eval" not in allowed["engine"] and "engine" not in allowed["eval"]
    assert "model" not in allowed["kvcache"] and "model" not in allowed["text"]


def test_the_tree_follows_the_layering():
    v = check.violations(ROOT, build_rooms())
    assert not v, "layering violations:\n" + "\n".join(v)


def test_the_check_catches_each_kind(tmp_path):
    rooms = check.read_rooms("core:\nops: core\ncodec: ops\ntext: core\nmodel: codec text\neval: model\n")
    files = {
        "src/ops/cpu/pq.cpp": '#include "codec/product_quantizer.h"\n#include "core/error.h"\n',
        "src/core/x.h": '#include "model/gguf.h"\n',
        "src/codec/ok.cpp": '#include "ops/ref/pq.h"\n#include "veloxquant/status.h"\n#include <vector>\n',
        "src/eval/ok.cpp": '#include "model/model.h"\n#include "text/tokenizer.h"\n#include "core/error.h"\n',
        "src/text/tok.cpp": '#include "model/gguf.h"\n',
        "src/model/up.cpp": '#include "../engine/pool.h"\n#include "eval/perplexity.h"\n',
        "src/attic/x.cpp": '#include "core/error.h"\n',
        "include/veloxquant/api.h": '#include "model/model.h"\n#include "veloxquant/status.h"\n',
        "tools/veloxquant/main.cpp": '#include "eval/perplexity.h"\n',
        # The CLI: public headers, its own, and CLI_ALLOWED only (model/session.h: bench_e2e.cpp's).
        "tools/veloxquant/cmd_x.cpp": ('#include "veloxquant/engine.h"\n#include "cli_kv.h"\n#include <CLI/CLI.hpp>\n'
                                       '#include "core/error.h"\n#include "model/session.h"\n'),
        "tools/veloxquant/bench_e2e.cpp": '#include "model/session.h"\n#include "core/error.h"\n',
        "tools/other/x.cpp": '#include "model/session.h"\n',
    }
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    v = check.violations(tmp_path, rooms)
    assert len(v) == 9, v
    assert v[0].startswith("include/veloxquant/api.h:1: the public header includes internal 'model/model.h'")
    assert v[1].startswith("src/attic/x.cpp: src/attic is not a room")
    assert v[2].startswith("src/core/x.h:1: core includes 'model/gguf.h' from model, a room it does not link")
    assert "src/model/up.cpp:1: '../engine/pool.h' climbs out" in v[3]
    assert v[4].startswith("src/model/up.cpp:2: model includes 'eval/perplexity.h' from eval")
    assert v[5].startswith("src/ops/cpu/pq.cpp:1: ops includes 'codec/product_quantizer.h' from codec")
    assert v[6].startswith("src/text/tok.cpp:1: text includes 'model/gguf.h' from model")
    assert v[7].startswith("tools/veloxquant/cmd_x.cpp:5: the CLI includes internal 'model/session.h'"), v[7]
    assert v[8].startswith("tools/veloxquant/main.cpp:1: the CLI includes internal 'eval/perplexity.h'"), v[8]


def test_every_cli_allowance_is_used():
    """An allow-list entry no CLI file needs any more goes (the list only shrinks with the API)."""
    cli = ROOT / check.CLI
    used = set()
    for f in cli.iterdir():
        for line in f.read_text(errors="replace").splitlines():
            m = check.INCLUDE.match(line)
            if m and "/" in m.group(2) and not m.group(2).startswith("veloxquant/"):
                for key, (files, _) in check.CLI_ALLOWED.items():
                    if (m.group(2) == key or (key.endswith("/") and m.group(2).startswith(key))) and (
                            files == "*" or f.name in files):
                        used.add(key)
    assert used == set(check.CLI_ALLOWED), f"unused allowances: {sorted(set(check.CLI_ALLOWED) - used)}"

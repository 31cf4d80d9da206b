"""The CPU engine rules (src/engines/rules/{llamacpp,ktkernel}.json) against the sources they cite:
every source's file exists at the pinned release, the cited line lies in the named function (one of
its identifiers on that line or up to 60 lines above it, or, in Python, the def enclosing it), and every error message a rule quotes
('...') is in the engine's code. The sources come from scripts/engines/cpu_sources.sh (cached
outside the clone; FP4MOE_CPU_ENGINE_SRC names the root); without them the test is skipped."""
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(os.environ.get("FP4MOE_CPU_ENGINE_SRC", Path.home() / ".cache/fp4moe/cpu-engine-src"))
# Where each engine's cited paths start, inside what cpu_sources.sh unpacked.
ENGINES = {"llamacpp": "llamacpp-{v}/vendor/llama.cpp", "ktkernel": "ktkernel-{v}"}
CITE = re.compile(r"([\w./-]+\.(?:py|c|cpp|h)):(\d+)")


def rules(name):
    return json.loads((ROOT / "src/engines/rules" / f"{name}.json").read_text())


def source_root(name):
    doc = rules(name)
    (version,) = doc["releases"]
    root = SRC / ENGINES[name].format(v=version)
    if not root.is_dir():
        pytest.skip(f"{root} missing: run scripts/engines/cpu_sources.sh")
    return root


def rows(doc):
    return doc["rules"] + doc["backends"]


def identifiers(function):
    return [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", function)
            if w not in ("with", "only", "requires", "check", "backend", "method")]


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_cited_lines_are_in_the_named_functions(name):
    root = source_root(name)
    checked = 0
    for row in rows(rules(name)):
        s = row["source"]
        cites = [(s["file"], s["line"], s["function"])]
        cites += [(f, int(n), None) for f, n in CITE.findall(s.get("also", ""))]
        for file, line, function in cites:
            path = root / file
            assert path.is_file(), f"{row['id']}: {file} is not in {root}"
            lines = path.read_text(errors="replace").splitlines()
            assert 1 <= line <= len(lines), f"{row['id']}: {file}:{line} past the end"
            if function:
                words = identifiers(function)
                window = "\n".join(lines[max(0, line - 61):line])
                # Python: the def the line is in, however long the function.
                enclosing = next((m.group(1) for m in (re.match(r"\s*def (\w+)", t)
                                                       for t in reversed(lines[:line])) if m), "")
                assert any(w in window or w == enclosing for w in words), \
                    f"{row['id']}: none of {words} at or above {file}:{line} (in def {enclosing})"
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_quoted_errors_are_the_engines_own(name):
    root = source_root(name)
    code = {p: p.read_text(errors="replace") for p in root.rglob("*.py")}
    quoted = 0
    for row in rules(name)["rules"]:
        for conclusion in row["modules"].values():
            for text in re.findall(r"\w+Error '([^']+)'", conclusion.get("fails", "")):
                assert any(text in c for c in code.values()), f"{row['id']}: '{text}' not in {name}"
                quoted += 1
    if name == "llamacpp":
        assert quoted >= 2  # KeyError 'Missing routed expert tensors', ValueError 'Can not map tensor'

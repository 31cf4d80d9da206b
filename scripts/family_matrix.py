#!/usr/bin/env python3
"""Every model family through every command: for each `fp4moe synth --list-layouts` layout (a
small synthetic checkpoint in that family's real layout and config dialect), runs inspect, check,
plan, verify and `bench --checkpoint` on it, then `convert --to nvfp4` and verify/check of the
output, and prints one Markdown table: per cell the exit status and what the command said (the
routed experts' scheme, the worst verify error, the refusal's first sentence).

    python3 scripts/family_matrix.py [--binary build/release/fp4moe] [--json]

Standard library only; about two minutes on 2 idle cores. Exit status 1 when a command ended
outside the exit-code table (0 ok, 1 a check failed, 2 bad input: a crash or a signal), else 0.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(binary: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def first_sentence(text: str) -> str:
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = line.removeprefix("error: ").strip()
    return line if len(line) <= 160 else line[:157] + "..."


def cell(proc: subprocess.CompletedProcess, ok_text: str = "") -> dict:
    said = ok_text if proc.returncode == 0 else first_sentence(proc.stderr or proc.stdout)
    return {"exit": proc.returncode, "said": said}


def routed_scheme(doc: dict) -> str:
    return str(doc.get("summary", {}).get("routed_experts", "?"))


def worst_error(doc: dict) -> str:
    errs = [x.get("rel_l2_error") for x in doc.get("layers", []) if isinstance(x, dict)]
    errs = [e for e in errs if isinstance(e, (int, float))]
    return f"{doc['layers'][0].get('expert_scheme')}, rel L2 err {max(errs):.1e}" if errs else ""


def json_of(proc: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {}


def family_row(binary: Path, layout: str, work: Path) -> dict:
    src = work / layout
    row = {"layout": layout}
    made = run(binary, "synth", layout, src, "--layers", 1, "--experts", 4)
    if made.returncode != 0:
        row["synth"] = cell(made)
        return row
    insp = run(binary, "inspect", src, "--json")
    row["inspect"] = cell(insp, "routed " + routed_scheme(json_of(insp)))
    row["check"] = cell(run(binary, "check", src))
    row["plan"] = cell(run(binary, "plan", src, "--target", "sm_100"))
    ver = run(binary, "verify", src, "--tokens", 4, "--json")
    row["verify"] = cell(ver, worst_error(json_of(ver)))
    row["bench"] = cell(run(binary, "bench", "--checkpoint", src, "--seconds", 0.2))
    out = work / f"{layout}.nvfp4"
    conv = run(binary, "convert", src, out, "--to", "nvfp4")
    row["convert"] = cell(conv, "written")
    if conv.returncode == 0:
        ver = run(binary, "verify", out, "--tokens", 4, "--json")
        row["verify converted"] = cell(ver, worst_error(json_of(ver)))
        row["check converted"] = cell(run(binary, "check", out))
    return row


COLUMNS = ["inspect", "check", "plan", "verify", "bench", "convert", "verify converted",
           "check converted"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "release" / "fp4moe")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    layouts = run(a.binary, "synth", "--list-layouts").stdout.split()
    with tempfile.TemporaryDirectory(prefix="fp4moe-families.") as tmp:
        rows = [family_row(a.binary, layout, Path(tmp)) for layout in layouts]
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| layout | " + " | ".join(COLUMNS) + " |")
        print("|---" * (len(COLUMNS) + 1) + "|")
        for r in rows:
            cells = []
            for c in COLUMNS:
                x = r.get(c)
                cells.append("-" if x is None else
                             f"{x['exit']}" + (f": {x['said']}" if x["said"] else ""))
            print(f"| {r['layout']} | " + " | ".join(cells) + " |")
    codes = [x["exit"] for r in rows for k, x in r.items() if k != "layout"]
    return 0 if all(c in (0, 1, 2) for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

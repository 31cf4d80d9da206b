#!/usr/bin/env python3
"""Records tests/engines/corpus_verdicts.json: the newest pinned SGLang (SM faked 90, 100, 120)
and vLLM (UnspecifiedPlatform) run their own config resolution (src/engines/resolve.py) over every
tests/data/corpus directory (configs only) and over `fp4moe convert`'s plain ModelOpt NVFP4 output
(tests/engines/corpus.py: CONVERTED), one process per engine and SM.

    scripts/engines/corpus_verdicts.py --sglang-py PY --vllm-py PY --binary build/release/fp4moe
        [--raw DIR] [--reuse-raw]

--raw keeps each process's JSON (DIR/ENGINE-smSM-GROUP.json, GROUP corpus or converted);
--reuse-raw aggregates the files already in DIR instead of running a process for them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "engines"))
import corpus as C  # noqa: E402


def run(py: str, engine: str, sm, dirs: dict, raw: Path, group: str, reuse: bool) -> list:
    out = raw / f"{engine}-sm{sm}-{group}.json"
    if not (reuse and out.exists()):
        jobs = raw / f"jobs-{engine}-sm{sm}-{group}.json"
        jobs.write_text(json.dumps([{"checkpoint": str(d), "flags": {}} for d in dirs.values()]))
        cmd = [py, str(ROOT / "src" / "engines" / "resolve.py"), "--engine", engine, "--jobs",
               str(jobs)]
        if sm is not None:
            cmd += ["--sm", str(sm)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"{engine} sm{sm} {group}: {p.stderr[-2000:]}")
        out.write_text(p.stdout)
    results = json.loads(out.read_text())
    by_dir = {Path(d).name: n for n, d in dirs.items()}
    return [C.entry(r, by_dir[r["checkpoint"]]) for r in results]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sglang-py", default=os.environ.get("FP4MOE_ENGINE_SGLANG_PY"))
    ap.add_argument("--vllm-py", default=os.environ.get("FP4MOE_ENGINE_VLLM_PY"))
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "release" / "fp4moe")
    ap.add_argument("--raw", type=Path)
    ap.add_argument("--reuse-raw", action="store_true")
    ap.add_argument("--out", type=Path, default=C.CORPUS_VERDICTS)
    ap.add_argument("--only", choices=["sglang", "vllm"],
                    help="run only this engine; the other's results come from --raw (--reuse-raw)")
    a = ap.parse_args(argv)
    raw = a.raw or Path(tempfile.mkdtemp(prefix="fp4moe-corpus-verdicts."))
    raw.mkdir(parents=True, exist_ok=True)
    corpus = C.corpus_dirs()
    converted = C.build_converted(a.binary, raw / "converted")
    pys = {"sglang": a.sglang_py, "vllm": a.vllm_py}
    tasks = [(e, sm, dirs, g) for e in ("sglang", "vllm") for sm in C.SMS[e]
             for g, dirs in (("corpus", corpus), ("converted", converted))
             if a.only in (None, e) or (raw / f"{e}-sm{sm}-{g}.json").exists()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(lambda t: run(pys[t[0]], t[0], t[1], t[2], raw, t[3], a.reuse_raw),
                              tasks))
    verdicts = [v for part in parts for v in part]
    versions = {e: sorted({v["version"] for v in verdicts if v["engine"] == e}) for e in pys}
    assert all(len(v) <= 1 for v in versions.values()), versions
    doc = {
        "schema": 1,
        "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "generator": "scripts/engines/corpus_verdicts.py (src/engines/resolve.py, configs only)",
        "versions": versions,
        "sms": {e: C.SMS[e] for e in C.SMS},
        "checkpoints": {
            **{n: {"source": f"tests/data/corpus/{n}", "config_sha256": C.config_digest(d)}
               for n, d in corpus.items()},
            **{n: {"source": "fp4moe synth {} --layers 1 --experts 4; fp4moe convert{}".format(
                       C.CONVERTED[n][0], "".join(" " + x for x in C.CONVERTED[n][1])),
                   "config_sha256": C.config_digest(d)} for n, d in converted.items()},
        },
        "verdicts": sorted(verdicts, key=lambda v: (v["engine"], v["checkpoint"], v["sm"] or 0)),
    }
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{a.out}: {len(verdicts)} verdicts ({versions}); raw in {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

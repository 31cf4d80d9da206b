#!/usr/bin/env bash
# Usage: scripts/engines/newest.sh ENGINE      (ENGINE = sglang | vllm)
# Prints the newest pinned version of ENGINE, the one the engine-oracle tests run live: its one
# home is tests/engines/verdicts.py (standard library only, so any python3 runs it).
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 sglang|vllm" >&2; exit 2; }
cd "$(dirname "$0")/../.."
python3 -c 'import sys; sys.path.insert(0, "tests/engines"); import verdicts as v; print(v.newest(sys.argv[1]))' "$1"

"""`python -m fp4moe` and the `fp4moe` command: the command-line tool shipped in this package
(bin/fp4moe, the same binary the CMake build makes), run in place of this process so that its
exit status and its signal handling (Ctrl-C in `convert`) are the tool's own."""
import os
import sys
from pathlib import Path


def main() -> None:
    tool = Path(__file__).resolve().parent / "bin" / "fp4moe"
    os.execv(tool, ["fp4moe", *sys.argv[1:]])


if __name__ == "__main__":
    main()

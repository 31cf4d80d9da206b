"""pytest setup: makes the fp4moe binding importable and prints each test's random seed."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("FP4MOE_BUILD_DIR", str(ROOT / "build" / "release"))

BASE_SEED = int(os.environ.get("FP4MOE_TEST_SEED", "20261129"))


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is in the test's report so a failure can be replayed with
    FP4MOE_TEST_SEED=<seed>."""
    seed = BASE_SEED
    request.node.user_properties.append(("seed", seed))
    print(f"[seed {seed}] replay with FP4MOE_TEST_SEED={seed}")
    return np.random.default_rng(seed)

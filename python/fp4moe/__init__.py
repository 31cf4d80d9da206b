"""fp4moe: FP4 Mixture-of-Experts checkpoints detected exactly, converted losslessly and run on
CPU kernels.

The API is the C++ library's (bound in src/python with nanobind; see _fp4moe.pyi for every
signature): inspect/plan/check/convert on checkpoint directories, the element codecs and block
formats on numpy arrays, and the kernels (Weights, Linear, MoELayer) on numpy arrays or, zero-copy
through DLPack, CPU torch tensors. Bad input raises Fp4moeError (a ValueError; Fp4moeTypeError for
a wrong type or dtype) naming the argument. The `fp4moe` command and `python -m fp4moe` run the
command-line tool shipped in this package.
"""
from ._fp4moe import *  # noqa: F403
from ._fp4moe import __version__  # noqa: F401

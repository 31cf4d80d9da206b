// Invariant checks: a broken invariant is a bug in fp4moe, not bad input, so it aborts with
// file:line.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FP4MOE_CHECK(cond)                                                                     \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fp4moe invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

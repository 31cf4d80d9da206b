// The AMX tile configuration (palette 1) that ldtilecfg reads, shared by the AMX kernel files and
// bench_peaks' AMX loop; include only from files compiled with -mamx-tile.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fp4moe::kernels::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile register
  uint8_t rows[16] = {};

  TileConfig& tile(int t, int tile_rows, int bytes_per_row) {
    rows[t] = static_cast<uint8_t>(tile_rows);
    colsb[t] = static_cast<uint16_t>(bytes_per_row);
    return *this;
  }
};

// GCC's tile intrinsics are asm statements that name their tile by token pasting (so tile numbers
// must be literals) and tell the compiler nothing about the memory they read (ldtilecfg: 8 bytes,
// tileloadd: none). This compiler barrier orders the plain stores that filled a buffer (a tile
// config, decoded weights, copied codes) before the tile instructions that read it.
inline void stores_before_tile_reads() { __asm__ volatile("" ::: "memory"); }

// Loads `c` into this thread's tile configuration.
inline void load_tile_config(const TileConfig& c) {
  stores_before_tile_reads();
  _tile_loadconfig(&c);
}

}  // namespace
}  // namespace fp4moe::kernels::amx

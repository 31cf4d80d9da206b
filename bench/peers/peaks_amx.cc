// AMX-INT8 throughput loop of bench_peaks (see peaks.h): TDPBSSD on four independent C tiles from
// two A and two B tiles (16 rows each), K bytes per row as asked. Runs only where
// dispatch::host_supports(kAmxInt8) (which also obtained the OS's tile permission).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/amx/tile_config.h"
#include "peaks.h"

namespace fp4moe::bench {

int32_t tdpbssd_i8_amx(int64_t iters, int k) {
  kernels::amx::TileConfig c;
  for (int t = 0; t < 4; ++t) c.tile(t, 16, 64);     // C: 16 x 16 int32
  for (int t = 4; t < 6; ++t) c.tile(t, 16, k);      // A: 16 x k int8
  for (int t = 6; t < 8; ++t) c.tile(t, k / 4, 64);  // B: k / 4 x 64 int8
  kernels::amx::load_tile_config(c);
  alignas(64) int8_t src[16 * 64];
  std::memset(src, 1, sizeof src);
  kernels::amx::stores_before_tile_reads();
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) int32_t out[16][16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0][0] ^ out[15][15];
}

}  // namespace fp4moe::bench

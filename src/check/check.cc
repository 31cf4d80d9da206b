// `fp4moe check` (check.h): shards -> tensor modules (detect/tensors.h) -> per-module scale and
// sampled-weight statistics on the thread pool -> findings; then the cross-module checks (gate/up
// pairs, magnitude outliers) and the configs' declarations against the tensors.
#include "check/check.h"

#include <fmt/core.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/holes.h"
#include "checkpoint/safetensors.h"
#include "core/thread_pool.h"
#include "detect/arch.h"
#include "detect/claims.h"
#include "detect/tensors.h"
#include "formats/scalar.h"

namespace fp4moe::check {
namespace {

namespace fs = std::filesystem;
using checkpoint::DType;
using checkpoint::SafetensorsFile;
using checkpoint::TensorInfo;
using detect::Scheme;

constexpr size_t kMaxExamples = 5;
// Per-tensor scales outside this range of implied |w|max cannot be a real weight's: LLM weights
// have |w|max between about 1e-4 and 1e3 (2^-20 and 2^12 leave wide margins both ways).
constexpr double kPlausibleAmaxLow = 0x1p-20, kPlausibleAmaxHigh = 0x1p12;
constexpr double kOutlierRatio = 100.0;  // weight_magnitude_outlier: RMS vs peers' median
constexpr double kZeroBlockShare = 0.5;  // all_zero_blocks_share
constexpr double kConstantShare = 0.9;   // scale_range_suspicious: share of constant lines
constexpr double kChanceShare = 0.45;    // ...that chance alone would give at most
constexpr int kMinGridForLayout = 4;     // ...judged only on grids of at least 4 lines
constexpr int kMinLineForLayout = 8;     // ...of at least 8 blocks each (see layout_suspicion)
// gate_up_scale_mismatch: vLLM compares w1/w3 weight_scale_2 with torch.allclose (rtol 1e-5);
// below that relative difference keeping w1's scale is exact to float precision.
constexpr double kGateUpRelTolerance = 1e-5;
constexpr size_t kModulesPerProgressStep = 64;

// A tensor of an opened shard.
struct Located {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};

// The findings of one module (or of the whole checkpoint), merged in table order at the end.
// add() with an empty example only counts: places are recorded with count 0 and counted once.
struct Sink {
  std::map<std::string, CheckFinding> by_id;
  void add(std::string_view id, int64_t count, Example example) {
    auto& f = by_id[std::string(id)];
    f.id = std::string(id);
    f.count += count;
    if (!example.tensor.empty() && f.examples.size() < kMaxExamples) {
      f.examples.push_back(std::move(example));
    }
  }
  void merge(Sink&& other) {
    for (auto& [id, f] : other.by_id) {
      auto& mine = by_id[id];
      mine.id = id;
      mine.count += f.count;
      for (auto& e : f.examples) {
        if (mine.examples.size() < kMaxExamples) mine.examples.push_back(std::move(e));
      }
    }
  }
};

struct ModuleStats {
  std::string name;
  std::string weight_name;  // the module's weight tensor, named by module-level examples
  Scheme scheme = Scheme::kUnknown;
  std::optional<double> tensor_scale;  // as a dequant multiplier (a CT divisor inverted)
  std::string tensor_scale_name;
  bool convention_flagged = false;  // global_scale_convention: tensor_scale is the other reading
  bool values_trusted = true;       // false: a per-tensor scale is not a positive number
  bool checked = false;             // its tensors were located and fit: scales were read
  double rms = -1.0;                // of the sampled dequantized weights; < 0 when not sampled
  int64_t never_written = 0;        // tensors of the module that are file holes
  uint64_t scale_bytes = 0, weight_bytes = 0;
  // NVFP4 activation scales read (finite, > 0), and how many are exactly 1.0: the placeholder
  // input_scale_default looks for (an input_global_scale of 1.0 is the same amax).
  int64_t nvfp4_input_scales = 0, nvfp4_input_scales_one = 0;
  std::string input_scale_name;
  Sink sink;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The rows of a [rows, ...] tensor to sample when not every row is read (rows > sample_rows):
// `sample_rows` distinct rows drawn from (seed, tensor name), so the same seed picks the same
// rows on every run.
std::vector<int64_t> sample_rows(int64_t rows, const CheckOptions& o, std::string_view tensor) {
  std::set<int64_t> picked;
  uint64_t state = o.seed ^ name_hash(tensor);
  while (static_cast<int>(picked.size()) < o.sample_rows) {
    state = splitmix(state);
    picked.insert(static_cast<int64_t>(state % static_cast<uint64_t>(rows)));
  }
  return {picked.begin(), picked.end()};
}

// Reads an F32 (or BF16/F16) scalar scale tensor; nullopt for another shape or dtype.
std::optional<double> read_scalar(const Located& t) {
  if (t.info->element_count != 1) return std::nullopt;
  const auto bytes = t.file->data(*t.info);
  switch (t.info->dtype) {
    case DType::F32: {
      float v;
      std::memcpy(&v, bytes.data(), 4);
      return v;
    }
    case DType::BF16: {
      uint16_t v;
      std::memcpy(&v, bytes.data(), 2);
      return formats::decode_bf16(v);
    }
    case DType::F16: {
      uint16_t v;
      std::memcpy(&v, bytes.data(), 2);
      return formats::decode_fp16(v);
    }
    default:
      return std::nullopt;
  }
}

// Asks the kernel to read a mapped range ahead, asynchronously: a scale grid is then read in
// large sequential requests instead of one page fault at a time (the cold-cache case).
void read_ahead(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

bool is_hole(const Located& t) {
  return checkpoint::is_file_hole(
      t.file->path(), t.file->header().data_offset() + t.info->data_begin, t.info->byte_size());
}

bool is_quantized(Scheme s) {
  return s != Scheme::kBf16 && s != Scheme::kUnknown && s != Scheme::kAbsent;
}

// The format a module is checked as. Classification (detect/tensors.h) already requires the scale
// shape to fit; a module whose dtypes say FP4 or FP8 with a block scale beside them but whose
// shapes did not classify is checked by its dtypes, so that the shapes become a finding
// (scale_shape_mismatch) instead of the module silently dropping out of the check.
Scheme checked_scheme(const detect::TensorModule& m) {
  if (is_quantized(m.spec.scheme)) return m.spec.scheme;
  const auto part = [&](std::string_view s) -> const detect::TensorRecord* {
    auto it = m.parts.find(std::string(s));
    return it == m.parts.end() ? nullptr : it->second;
  };
  if (part("_blocks") && part("_scales")) return Scheme::kMxfp4;
  const detect::TensorRecord* w = part("weight_packed") ? part("weight_packed") : part("weight");
  const detect::TensorRecord* s = part("weight_scale")       ? part("weight_scale")
                                  : part("weight_scale_inv") ? part("weight_scale_inv")
                                                             : part("scale");
  if (w == nullptr || s == nullptr) return Scheme::kUnknown;
  if (w->dtype == "U8" || w->dtype == "I8") {
    if (s->dtype == "F8_E4M3") return Scheme::kNvfp4;
    if (s->dtype == "F8_E8M0" || s->dtype == "U8") return Scheme::kMxfp4;
  }
  if (w->dtype == "F8_E4M3" && s->shape.size() >= 2 &&
      (s->dtype == "F32" || s->dtype == "F8_E8M0" || s->dtype == "U8")) {
    return Scheme::kFp8Block;
  }
  return Scheme::kUnknown;
}

// Whether the [rows, cols] grid of one-byte codes is constant along one axis while it varies
// along the other (scale_range_suspicious), with the evidence.
//
// Judged against chance, two ways. MX (power-of-two) scales of well-behaved weights often sit in
// one or two binades, so short lines are often constant by chance alone:
// - across the grid: with codes drawn independently from the grid's own code histogram p, a line
//   of n blocks is constant with probability sum_i p_i^n; at least 90% of the lines must be
//   constant while that explains under 45%, and the constant lines must not all hold one value;
// - within a line, whose own magnitude the histogram does not know (rows of real weights differ
//   in scale): the constant lines must have at least 8 blocks. The amax of a block of 32
//   Gaussian values spans more than a binade between its 1% and 99% quantiles (1.5 and 3.6
//   sigma), so even a row placed best in one binade has a block there with probability 0.93
//   (0.86 for blocks of 16), and 0.93^8 = 58% of such rows constant stays under the 90% asked.
std::optional<std::string> layout_suspicion(std::span<const std::byte> codes, int64_t rows,
                                            int64_t cols) {
  if (rows < kMinGridForLayout || cols < kMinGridForLayout) return std::nullopt;
  const auto at = [&](int64_t r, int64_t c) {
    return static_cast<uint8_t>(codes[static_cast<size_t>(r * cols + c)]);
  };
  // Both scans stop as soon as more than 10% of the lines vary: a sound grid costs a few rows.
  const auto allowed_varying = [](int64_t lines) {
    return lines - static_cast<int64_t>(std::ceil(kConstantShare * static_cast<double>(lines)));
  };
  int64_t constant_rows = 0, varying_rows = 0;
  std::set<uint8_t> row_values, col_values;
  if (cols >= kMinLineForLayout) {
    for (int64_t r = 0; r < rows && varying_rows <= allowed_varying(rows); ++r) {
      bool same = true;
      for (int64_t c = 1; c < cols && same; ++c) same = at(r, c) == at(r, 0);
      if (same) {
        ++constant_rows;
        row_values.insert(at(r, 0));
      } else {
        ++varying_rows;
      }
    }
  }
  int64_t constant_cols = 0;
  if (rows >= kMinLineForLayout) {
    std::vector<uint8_t> col_same(static_cast<size_t>(cols), 1);
    int64_t varying_cols = 0;
    for (int64_t r = 1; r < rows && varying_cols <= allowed_varying(cols); ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        if (col_same[static_cast<size_t>(c)] && at(r, c) != at(0, c)) {
          col_same[static_cast<size_t>(c)] = 0;
          ++varying_cols;
        }
      }
    }
    for (int64_t c = 0; c < cols && varying_cols <= allowed_varying(cols); ++c) {
      constant_cols += col_same[static_cast<size_t>(c)];
      if (col_same[static_cast<size_t>(c)]) col_values.insert(at(0, c));
    }
  }
  const bool rows_constant =
      varying_rows <= allowed_varying(rows) && constant_rows > 0 && row_values.size() > 1;
  const bool cols_constant =
      constant_cols >= kConstantShare * static_cast<double>(cols) && col_values.size() > 1;
  if (!rows_constant && !cols_constant) return std::nullopt;
  // Only a grid that looks broadcast pays for the histogram.
  std::array<int64_t, 256> histogram{};
  for (const std::byte code : codes) ++histogram[static_cast<uint8_t>(code)];
  const auto chance = [&](int64_t n) {
    double share = 0;
    for (const int64_t h : histogram) {
      share += std::pow(static_cast<double>(h) / static_cast<double>(codes.size()),
                        static_cast<double>(n));
    }
    return share;
  };
  if (rows_constant && chance(cols) < kChanceShare) {
    return fmt::format(
        "{} of {} rows hold one scale along all {} blocks of K while rows differ ({} distinct; "
        "chance gives {:.0f}% constant rows): a per-channel scale broadcast into blocks?",
        constant_rows, rows, cols, row_values.size(), 100.0 * chance(cols));
  }
  if (cols_constant && chance(rows) < kChanceShare) {
    return fmt::format(
        "{} of {} block columns hold one scale along all {} rows while columns differ ({} "
        "distinct): a transposed grid?",
        constant_cols, cols, rows, col_values.size());
  }
  return std::nullopt;
}

// The storage of one quantized module, located in the shards.
struct Parts {
  Located weight, scale, tensor_scale, input_scale;
  bool divisor = false;  // the tensor scale is compressed-tensors' weight_global_scale
  int64_t rows = 0, blocks_per_row = 0, row_bytes = 0;
  int block_elems = 0;     // elements per block scale along K (16, 32; 128 for FP8 blocks)
  int64_t block_rows = 1;  // weight rows per scale-grid row (128 for FP8 blocks, else 1)
};

class ModuleChecker {
 public:
  ModuleChecker(const std::map<std::string, Located>& tensors, const CheckOptions& options)
      : tensors_(tensors), options_(options) {}

  ModuleStats run(const detect::TensorModule& m, Scheme scheme) const {
    ModuleStats st;
    st.name = m.name;
    st.scheme = scheme;
    Parts p;
    if (!locate(m, p, st)) return st;
    st.weight_name = p.weight.info->name;
    // A tensor that is a file hole was never written: reported once. The scales are still read
    // in full when only the weight is a hole (a header-only checkpoint with real scales); when
    // the scale grid is a hole there is nothing left to judge.
    const bool weight_hole = is_hole(p.weight);
    const bool scale_hole = p.scale.info != nullptr && is_hole(p.scale);
    for (const auto& [t, hole] : {std::pair{&p.weight, weight_hole}, {&p.scale, scale_hole}}) {
      if (hole) {
        ++st.never_written;
        st.sink.add("all_zero_tensor", 1, {t->info->name, -1, -1, "a file hole: never written"});
      }
    }
    if (scale_hole) return st;
    st.checked = true;
    check_scales(p, st, weight_hole);
    if (!weight_hole) check_weights(p, st);
    return st;
  }

 private:
  const Located* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  const Located* part(const detect::TensorModule& m, std::string_view suffix) const {
    auto it = m.parts.find(std::string(suffix));
    if (it == m.parts.end()) return nullptr;
    return find(it->second->name);
  }

  bool shape_error(const Parts& p, ModuleStats& st, const std::string& why,
                   const Located* culprit = nullptr) const {
    const TensorInfo* named = culprit && culprit->info ? culprit->info
                              : p.scale.info           ? p.scale.info
                                                       : p.weight.info;
    st.sink.add(
        "scale_shape_mismatch", 1,
        {named->name, -1, -1,
         "weight " + std::string(checkpoint::dtype_name(p.weight.info->dtype)) + " " +
             shape_text(p.weight.info->shape) +
             (p.scale.info ? ", scale " + std::string(checkpoint::dtype_name(p.scale.info->dtype)) +
                                 " " + shape_text(p.scale.info->shape)
                           : "") +
             ": " + why});
    return false;
  }

  // Finds the module's tensors and checks that the scale grid fits the weight.
  bool locate(const detect::TensorModule& m, Parts& p, ModuleStats& st) const {
    const auto pick = [&](std::initializer_list<std::string_view> suffixes) -> Located {
      for (auto s : suffixes) {
        if (const Located* l = part(m, s)) return *l;
      }
      return {};
    };
    p.weight = pick({"_blocks", "weight_packed", "weight"});
    if (p.weight.info == nullptr) return false;
    const auto& w = *p.weight.info;
    switch (st.scheme) {
      case Scheme::kNvfp4: {
        p.scale = pick({"weight_scale"});
        p.tensor_scale = pick({"weight_scale_2"});
        if (p.tensor_scale.info == nullptr) {
          p.tensor_scale = pick({"weight_global_scale"});
          p.divisor = p.tensor_scale.info != nullptr;
        }
        p.input_scale = pick({"input_scale", "input_global_scale"});
        p.block_elems = 16;
        break;
      }
      case Scheme::kMxfp4:
        p.scale = pick({"_scales", "weight_scale", "scale"});
        p.block_elems = 32;
        break;
      case Scheme::kFp8Block:
        p.scale = pick({"weight_scale_inv", "scale", "weight_scale"});
        p.block_elems =
            m.spec.scheme == Scheme::kFp8Block && m.spec.group_size > 0 ? m.spec.group_size : 128;
        break;
      case Scheme::kFp8Tensor:
        p.tensor_scale = pick({"weight_scale"});
        p.input_scale = pick({"input_scale"});
        p.block_elems = 0;
        break;
      case Scheme::kFp8Channel:
      case Scheme::kMxfp8:
      case Scheme::kInt4:
      case Scheme::kBf16:
      case Scheme::kAbsent:
      case Scheme::kUnknown:
        return false;  // not a format whose numbers this command reads
    }
    if (st.scheme != Scheme::kFp8Tensor && p.scale.info == nullptr) {
      return shape_error(p, st, "no block scale tensor");
    }
    for (const Located* t : {&p.tensor_scale, &p.input_scale}) {
      if (t->info && (t->info->element_count != 1 || !read_scalar(*t))) {
        return shape_error(
            p, st,
            fmt::format("the per-tensor scale {} is {} {}, not one float", t->info->name,
                        checkpoint::dtype_name(t->info->dtype), shape_text(t->info->shape)),
            t);
      }
    }
    if (st.scheme == Scheme::kNvfp4 && p.tensor_scale.info == nullptr) {
      return shape_error(p, st, "no per-tensor scale (weight_scale_2 or weight_global_scale)");
    }
    // The loops below index one byte per packed pair / FP8 code and one byte (or one F32) per
    // block scale: other storage widths would read past the tensor, so they are a finding.
    if (checkpoint::dtype_bits(w.dtype) != 8) {
      return shape_error(p, st, "the weight is not stored in bytes (U8/I8/F8)");
    }
    if (p.scale.info != nullptr) {
      const DType sd = p.scale.info->dtype;
      const bool byte_scale = sd == DType::U8 || sd == DType::F8_E4M3 || sd == DType::F8_E8M0;
      const bool f32_scale = sd == DType::F32 && st.scheme == Scheme::kFp8Block;
      if (!byte_scale && !f32_scale) {
        return shape_error(p, st,
                           "block scales stored as " + std::string(checkpoint::dtype_name(sd)) +
                               " (expected U8, F8_E4M3 or F8_E8M0; F32 for FP8 blocks)");
      }
    }
    if (st.scheme == Scheme::kFp8Block || st.scheme == Scheme::kFp8Tensor) {
      if (w.shape.size() != 2) return shape_error(p, st, "not a 2-D weight");
      p.rows = w.shape[0];
      p.row_bytes = w.shape[1];
      if (st.scheme == Scheme::kFp8Block) {
        const auto& s = p.scale.info->shape;
        const int64_t b = p.block_elems;
        const int64_t gr = (w.shape[0] + b - 1) / b, gc = (w.shape[1] + b - 1) / b;
        if (s.size() != 2 || s[0] != gr || s[1] != gc) {
          return shape_error(p, st, fmt::format("the {}x{} grid needs [{}, {}]", b, b, gr, gc));
        }
        p.blocks_per_row = gc;
        p.block_rows = b;
      }
      return true;
    }
    // FP4: the scale grid [..., R, G] and the packed weight [..., R, G * block/2]; gpt-oss's fused
    // experts: weight [E, R, G, 16] and scales [E, R, G]. Dimensions are compared one by one: a
    // transposed grid has the right element count and the wrong shape.
    const auto& s = p.scale.info->shape;
    const auto& ws = w.shape;
    const int64_t bytes_per_block = p.block_elems / 2;
    const bool fused = m.parts.count("_blocks") > 0;
    std::vector<int64_t> want;
    if (fused) {
      if (ws.size() < 3 || ws.back() != bytes_per_block) {
        return shape_error(p, st,
                           fmt::format("fused blocks need [..., G, {}] bytes", bytes_per_block));
      }
      want.assign(ws.begin(), ws.end() - 1);
    } else {
      if (ws.size() < 2) return shape_error(p, st, "not a 2-D weight");
      if (ws.back() % bytes_per_block != 0) {
        return shape_error(p, st,
                           fmt::format("K = {} is not a multiple of the block of {}", 2 * ws.back(),
                                       p.block_elems));
      }
      want.assign(ws.begin(), ws.end());
      want.back() = ws.back() / bytes_per_block;
    }
    if (s != want) {
      return shape_error(p, st,
                         fmt::format("{} elements per block need the scale grid {}", p.block_elems,
                                     shape_text(want)));
    }
    int64_t scale_rows = 1;
    for (size_t i = 0; i + 1 < s.size(); ++i) scale_rows *= s[i];
    p.rows = scale_rows;
    p.blocks_per_row = s.back();
    p.row_bytes = s.back() * bytes_per_block;
    if (static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.row_bytes) != w.byte_size()) {
      return shape_error(p, st, "the packed weight's bytes do not match the scale grid");
    }
    return true;
  }

  void scalar_scale(const Located& t, bool is_input, ModuleStats& st, std::string_view what,
                    bool divisor) const {
    const auto v = read_scalar(t);  // located: one float
    st.scale_bytes += t.info->byte_size();
    if (!std::isfinite(*v)) {
      // An NVFP4 module's input scale is the W4A4 alpha: w4a4_without_input_scale names that.
      const bool w4a4 = is_input && st.scheme == Scheme::kNvfp4;
      st.sink.add(w4a4 ? "w4a4_input_scale_not_finite" : "scale_not_finite", 1,
                  {t.info->name, -1, -1, fmt::format("{} = {}", what, *v)});
      if (!is_input) st.values_trusted = false;
    } else if (*v <= 0) {
      st.sink.add("tensor_scale_nonpositive", 1,
                  {t.info->name, -1, -1, fmt::format("{} = {}", what, *v)});
      if (!is_input) st.values_trusted = false;
    } else if (!is_input) {
      st.tensor_scale = divisor ? 1.0 / *v : *v;
      st.tensor_scale_name = t.info->name;
    } else if (st.scheme == Scheme::kNvfp4) {
      ++st.nvfp4_input_scales;
      if (*v == 1.0f) {
        ++st.nvfp4_input_scales_one;
        st.input_scale_name = t.info->name;
      }
    }
  }

  // `weight_hole`: the weight was never written (reported once as such); zero block scales over
  // its zeros are then what a sparse writer leaves, not a defect of their own.
  void check_scales(const Parts& p, ModuleStats& st, bool weight_hole) const {
    if (p.tensor_scale.info) {
      scalar_scale(p.tensor_scale, false, st,
                   p.divisor ? "weight_global_scale" : "per-tensor scale", p.divisor);
    }
    if (p.input_scale.info) scalar_scale(p.input_scale, true, st, "input scale", false);
    if (p.scale.info == nullptr) return;
    const Located& s = p.scale;
    const auto bytes = s.file->data(*s.info);
    st.scale_bytes += bytes.size();
    const int64_t cols = p.blocks_per_row;
    const int64_t rows = static_cast<int64_t>(s.info->element_count) / std::max<int64_t>(cols, 1);
    switch (s.info->dtype) {
      case DType::F8_E4M3:
      case DType::F8_E8M0:
      case DType::U8: {
        const bool e8m0 = s.info->dtype != DType::F8_E4M3;
        int64_t nan = 0, negative = 0;
        // The largest code, in one pass the compiler vectorizes: below 0x7F (UE4M3) or 0xFF
        // (E8M0) there is no NaN and no sign bit, and the per-code scan is skipped.
        uint8_t max_code = 0;
        for (const std::byte code : bytes)
          max_code = std::max(max_code, static_cast<uint8_t>(code));
        const bool clean = max_code < (e8m0 ? formats::kE8M0NaN : 0x7F);
        if (!clean) max_code = 0;
        for (size_t i = 0; !clean && i < bytes.size(); ++i) {
          const auto c = static_cast<uint8_t>(bytes[i]);
          const int64_t r = static_cast<int64_t>(i) / cols, b = static_cast<int64_t>(i) % cols;
          if (e8m0 ? c == formats::kE8M0NaN : (c & 0x7F) == 0x7F) {
            if (nan++ < static_cast<int64_t>(kMaxExamples)) {
              st.sink.add("scale_nan_code", 0,
                          {s.info->name, r, b, fmt::format("code 0x{:02X}", c)});
            }
          } else if (!e8m0 && (c & 0x80) != 0) {
            // UE4M3 is unsigned: no quantizer sets the sign bit. An engine that decodes E4M3
            // reads a negative (or -0) scale and flips (or zeroes) the block.
            if (negative++ < static_cast<int64_t>(kMaxExamples)) {
              st.sink.add("block_scale_nonpositive", 0,
                          {s.info->name, r, b,
                           fmt::format("code 0x{:02X} = {} (sign bit set in a UE4M3 scale)", c,
                                       formats::decode_e4m3(c))});
            }
          } else if (!e8m0) {
            max_code = std::max(max_code, c);
          }
        }
        if (nan) st.sink.add("scale_nan_code", nan, {});
        if (negative) st.sink.add("block_scale_nonpositive", negative, {});
        if (auto why = layout_suspicion(bytes, rows, cols)) {
          st.sink.add("scale_range_suspicious", 1, {s.info->name, -1, -1, *why});
        }
        if (!e8m0 && st.scheme == Scheme::kNvfp4 && st.tensor_scale) {
          convention(p, st, formats::decode_ue4m3(max_code));
        }
        break;
      }
      case DType::F32: {
        int64_t bad = 0, nonpositive = 0;
        for (size_t i = 0; i < s.info->element_count; ++i) {
          float v;
          std::memcpy(&v, bytes.data() + 4 * i, 4);
          const auto r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
          if (!std::isfinite(v)) {
            if (bad++ < static_cast<int64_t>(kMaxExamples)) {
              st.sink.add("scale_not_finite", 0, {s.info->name, r, c, fmt::format("{}", v)});
            }
          } else if (v < 0 || (v == 0 && !weight_hole)) {
            if (nonpositive++ < static_cast<int64_t>(kMaxExamples)) {
              st.sink.add("block_scale_nonpositive", 0, {s.info->name, r, c, fmt::format("{}", v)});
            }
          }
        }
        if (bad) st.sink.add("scale_not_finite", bad, {});
        if (nonpositive) st.sink.add("block_scale_nonpositive", nonpositive, {});
        break;
      }
      default:
        // A block-scale dtype no producer here writes (BF16 grids, say): its values are not
        // judged rather than misread.
        st.values_trusted = false;
        break;
    }
  }

  // global_scale_convention: under NVIDIA's recipe the block holding the tensor's amax gets block
  // scale 448 (a gate/up pair sharing one scale: the larger of the two), so |w|max = 6 *
  // max_block_scale * multiplier. Read the stored value both ways; the convention its name says
  // is wrong when that reading is implausible for a weight and the other one is not (both
  // readings are plausible only for values within [0.66, 1.5], which no real scale takes). Once
  // flagged, the module's values are read the way the tensor evidently holds them, so the one
  // defect is not reported again as a gate/up mismatch or a magnitude outlier.
  void convention(const Parts& p, ModuleStats& st, float max_block_scale) const {
    const auto v = read_scalar(p.tensor_scale);
    if (!v || !std::isfinite(*v) || *v <= 0 || !(max_block_scale > 0)) return;
    const double as_multiplier = 6.0 * max_block_scale * *v;
    const double as_divisor = 6.0 * max_block_scale / *v;
    const auto plausible = [](double a) {
      return a >= kPlausibleAmaxLow && a <= kPlausibleAmaxHigh;
    };
    const double named = p.divisor ? as_divisor : as_multiplier;
    const double other = p.divisor ? as_multiplier : as_divisor;
    if (!plausible(named) && plausible(other)) {
      st.sink.add(
          "global_scale_convention", 1,
          {p.tensor_scale.info->name, -1, -1,
           fmt::format("{} = {:.6g}, largest block scale {:.6g}: as the {} its name says, "
                       "|w|max = {:.3g}; as a {}, |w|max = {:.3g}",
                       p.divisor ? "weight_global_scale" : "weight_scale_2", *v, max_block_scale,
                       p.divisor ? "divisor (compressed-tensors)" : "multiplier (ModelOpt)", named,
                       p.divisor ? "multiplier" : "divisor", other)});
      st.tensor_scale = p.divisor ? *v : 1.0 / *v;
      st.convention_flagged = true;
    }
  }

  // Dequantizes the sampled rows (all rows with --full): zero blocks, values that are not finite
  // in float32, and the RMS the outlier check compares with the module's peers. Blocks whose
  // scale is not a finite positive number are skipped: the scale findings report them, and
  // their values would only repeat that.
  void check_weights(const Parts& p, ModuleStats& st) const {
    const Located& w = p.weight;
    const auto bytes = w.file->data(*w.info);
    // Every row with --full or when there are few; the row list is never materialized then, so
    // a thread's memory stays bounded by sample_rows.
    const bool every_row = options_.full || p.rows <= options_.sample_rows;
    const std::vector<int64_t> picked =
        every_row ? std::vector<int64_t>{} : sample_rows(p.rows, options_, w.info->name);
    const int64_t row_count = every_row ? p.rows : static_cast<int64_t>(picked.size());
    const std::span<const std::byte> scales =
        p.scale.info ? p.scale.file->data(*p.scale.info) : std::span<const std::byte>{};
    const bool fp4 = st.scheme == Scheme::kNvfp4 || st.scheme == Scheme::kMxfp4;
    // +-0 in every byte of the block: both nibbles 0 or 8 in FP4, 0x00/0x80 in FP8.
    const uint8_t zero_mask = fp4 ? 0x77 : 0x7F;
    const double multiplier = st.tensor_scale.value_or(1.0);
    double sum_sq = 0;
    int64_t values = 0, zero_blocks = 0, blocks = 0, not_finite = 0, examples = 0;
    const int64_t block_bytes = st.scheme == Scheme::kFp8Block ? p.block_elems
                                : fp4                          ? p.block_elems / 2
                                                               : p.row_bytes;
    for (int64_t i = 0; i < row_count; ++i) {
      const int64_t r = every_row ? i : picked[static_cast<size_t>(i)];
      const auto row =
          bytes.subspan(static_cast<size_t>(r * p.row_bytes), static_cast<size_t>(p.row_bytes));
      st.weight_bytes += row.size();
      for (int64_t b0 = 0; b0 < p.row_bytes; b0 += block_bytes) {
        const int64_t b = b0 / block_bytes;
        const int64_t n = std::min(block_bytes, p.row_bytes - b0);
        const auto block = row.subspan(static_cast<size_t>(b0), static_cast<size_t>(n));
        ++blocks;
        const bool zero = std::all_of(block.begin(), block.end(), [&](std::byte x) {
          return (static_cast<uint8_t>(x) & zero_mask) == 0;
        });
        if (zero) ++zero_blocks;
        if (!st.values_trusted) continue;
        double s = multiplier;
        const size_t si = static_cast<size_t>((r / p.block_rows) * p.blocks_per_row + b);
        switch (st.scheme) {
          case Scheme::kNvfp4:
            s = formats::decode_ue4m3(static_cast<uint8_t>(scales[si])) * multiplier;
            break;
          case Scheme::kMxfp4:
            s = formats::decode_e8m0(static_cast<uint8_t>(scales[si]));
            break;
          case Scheme::kFp8Block:
            if (p.scale.info->dtype == DType::F32) {
              float f;
              std::memcpy(&f, scales.data() + 4 * si, 4);
              s = f;
            } else {
              s = formats::decode_e8m0(static_cast<uint8_t>(scales[si]));
            }
            break;
          case Scheme::kFp8Tensor:  // the per-tensor multiplier alone
          case Scheme::kFp8Channel:
          case Scheme::kMxfp8:
          case Scheme::kInt4:
          case Scheme::kBf16:
          case Scheme::kAbsent:
          case Scheme::kUnknown:  // not located: never reaches here
            break;
        }
        if (!std::isfinite(s)) continue;
        const int64_t elems = fp4 ? 2 * n : n;
        values += elems;
        if (zero) continue;
        bool reported = false;
        for (const std::byte byte : block) {
          const auto c = static_cast<uint8_t>(byte);
          double v[2];
          int k = 0;
          if (fp4) {
            v[k++] = formats::decode_e2m1(c & 0xF) * s;
            v[k++] = formats::decode_e2m1(c >> 4) * s;
          } else {
            v[k++] = formats::decode_e4m3(c) * s;
          }
          for (int i = 0; i < k; ++i) {
            // An engine computes in float32 (or narrower): a finite double beyond FLT_MAX is Inf.
            if (!std::isfinite(v[i]) || std::abs(v[i]) > std::numeric_limits<float>::max()) {
              ++not_finite;
              --values;
              if (!reported && examples++ < static_cast<int64_t>(kMaxExamples)) {
                st.sink.add("dequant_not_finite", 0,
                            {w.info->name, r, b,
                             fmt::format("value {} (code 0x{:02X}, block scale {:.6g})", v[i],
                                         fp4 ? (i == 0 ? c & 0xF : c >> 4) : c, s)});
              }
              reported = true;
              continue;
            }
            sum_sq += v[i] * v[i];
          }
        }
      }
    }
    if (not_finite) st.sink.add("dequant_not_finite", not_finite, {});
    if (blocks > 0 && zero_blocks == blocks) {
      // Every sampled block is zero: read the whole tensor before calling it all zero.
      bool all_zero = true;
      if (!every_row) {
        st.weight_bytes += bytes.size();
        all_zero = std::all_of(bytes.begin(), bytes.end(), [&](std::byte x) {
          return (static_cast<uint8_t>(x) & zero_mask) == 0;
        });
      }
      if (all_zero) {
        st.sink.add(
            "all_zero_tensor", 1,
            {w.info->name, -1, -1,
             fmt::format("all {} bytes are zero (every block of {} rows)", bytes.size(), p.rows)});
      } else {
        st.sink.add(
            "all_zero_blocks_share", 1,
            {w.info->name, -1, -1,
             fmt::format("all {} sampled blocks are zero, the rest of the tensor is not", blocks)});
      }
    } else if (blocks > 0 && zero_blocks > kZeroBlockShare * blocks) {
      st.sink.add("all_zero_blocks_share", 1,
                  {w.info->name, -1, -1,
                   fmt::format("{} of {} {}blocks are all zero ({:.0f}%)", zero_blocks, blocks,
                               options_.full ? "" : "sampled ", 100.0 * zero_blocks / blocks)});
    }
    if (st.values_trusted && values > 0) st.rms = std::sqrt(sum_sq / static_cast<double>(values));
  }

  const std::map<std::string, Located>& tensors_;
  const CheckOptions& options_;
};

// "layers.3.ffn.experts.17.w1" -> "layers.*.ffn.experts.*.w1": peers of a module. Only whole
// numeric components are indices; the digit of "w1" or "fc2" names a different projection.
std::string peer_key(std::string_view name) {
  std::string out;
  size_t begin = 0;
  while (begin <= name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(begin, end - begin);
    const bool index = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (begin > 0) out += '.';
    out += index ? std::string_view("*") : part;
    begin = end + 1;
  }
  return out;
}

// gate/up partner of a module name, or "" ("...w1" <-> "...w3", "gate_proj" <-> "up_proj").
std::pair<std::string, std::string> gate_up_pair(const std::string& name) {
  for (const auto& [gate, up] : {std::pair{".w1", ".w3"}, std::pair{".gate_proj", ".up_proj"}}) {
    const std::string_view g(gate);
    if (name.size() > g.size() && name.compare(name.size() - g.size(), g.size(), g) == 0) {
      const std::string base = name.substr(0, name.size() - g.size());
      return {base, base + up};
    }
  }
  return {"", ""};
}

// The decoder layer of a module name, for the per-layer counts: the name up to its
// "layers.N" component ("model.layers.3.mlp.experts.7" -> "model.layers.3"), else the
// name without its last component.
std::string layer_of(const std::string& name) {
  size_t pos = 0;
  while ((pos = name.find("layers.", pos)) != std::string::npos) {
    if (pos == 0 || name[pos - 1] == '.') {
      size_t end = pos + 7;
      while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
      if (end > pos + 7) return name.substr(0, end);
    }
    pos += 7;
  }
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

void cross_module_checks(const std::vector<ModuleStats>& stats, Sink& sink) {
  std::map<std::string, const ModuleStats*> by_name;
  for (const auto& s : stats) by_name[s.name] = &s;
  // gate_up_scale_mismatch, counted per decoder layer, for NVFP4 pairs only: engines load FP8
  // per-tensor w1/w3 with separate scales and requantize both to their max (vLLM's FP8 MoE), so
  // there a difference is not a defect. A module whose scale was flagged as the other convention
  // is left out: global_scale_convention already names that defect.
  struct Pair {
    double ratio;
    std::string gate, up, layer;
    double g, u;
  };
  std::vector<Pair> bad;
  std::map<std::string, std::pair<int64_t, int64_t>> per_layer;  // layer -> (bad, pairs)
  for (const auto& s : stats) {
    const auto [base, up_name] = gate_up_pair(s.name);
    if (base.empty() || s.scheme != Scheme::kNvfp4 || !s.tensor_scale || s.convention_flagged) {
      continue;
    }
    auto it = by_name.find(up_name);
    if (it == by_name.end() || it->second->scheme != Scheme::kNvfp4 || !it->second->tensor_scale ||
        it->second->convention_flagged) {
      continue;
    }
    const double g = *s.tensor_scale, u = *it->second->tensor_scale;
    const std::string layer = layer_of(base);
    auto& counts = per_layer[layer];
    ++counts.second;
    const double ratio = std::max(g, u) / std::min(g, u);
    if (ratio > 1.0 + kGateUpRelTolerance) {
      ++counts.first;
      bad.push_back({ratio, s.tensor_scale_name, it->second->tensor_scale_name, layer, g, u});
    }
  }
  if (!bad.empty()) {
    std::stable_sort(bad.begin(), bad.end(),
                     [](const Pair& a, const Pair& b) { return a.ratio > b.ratio; });
    int64_t pairs = 0, layers_hit = 0;
    for (const auto& [layer, c] : per_layer) {
      pairs += c.second;
      layers_hit += c.first > 0;
    }
    for (size_t i = 0; i < bad.size() && i < kMaxExamples; ++i) {
      const auto& b = bad[i];
      const auto& c = per_layer[b.layer];
      sink.add("gate_up_scale_mismatch", 0,
               {b.gate, -1, -1,
                fmt::format("{:.6g} vs {:.6g} ({}), ratio {:.4g}; {}: {} of {} pairs differ", b.g,
                            b.u, b.up, b.ratio, b.layer, c.first, c.second)});
    }
    sink.add("gate_up_scale_mismatch", static_cast<int64_t>(bad.size()), {});
    std::string layers;
    for (const auto& [layer, c] : per_layer) {
      if (c.first > 0)
        layers += fmt::format("{}{} {}/{}", layers.empty() ? "" : ", ", layer, c.first, c.second);
    }
    sink.by_id["gate_up_scale_mismatch"].summary = fmt::format(
        "{} of {} gate/up pairs in {} of {} layers differ; worst ratio {:.4g} (per layer: {})",
        bad.size(), pairs, layers_hit, per_layer.size(), bad.front().ratio, layers);
  }
  // weight_magnitude_outlier against the median of the module's peers (same name, other
  // layer/expert indices; at least 3 of them). Judged on dequantized values, so a module whose
  // scales were reported as not finite or non-positive has no RMS and is left out.
  std::map<std::string, std::vector<const ModuleStats*>> peers;
  for (const auto& s : stats) {
    if (s.rms > 0) peers[peer_key(s.name)].push_back(&s);
  }
  for (auto& [key, group] : peers) {
    if (group.size() < 3) continue;
    std::vector<double> rms;
    for (const auto* s : group) rms.push_back(s->rms);
    std::nth_element(rms.begin(), rms.begin() + static_cast<std::ptrdiff_t>(rms.size() / 2),
                     rms.end());
    const double median = rms[rms.size() / 2];
    for (const auto* s : group) {
      const double ratio = s->rms / median;
      if (ratio > kOutlierRatio || ratio < 1.0 / kOutlierRatio) {
        sink.add("weight_magnitude_outlier", 1,
                 {s->weight_name, -1, -1,
                  fmt::format("RMS {:.6g}, {:.3g}x the median {:.6g} of {} peers ({})", s->rms,
                              ratio, median, group.size(), key)});
      }
    }
  }
}

// The weight tensor of a module ("...weight", "...weight_packed", "..._blocks"), or "" if none.
std::string weight_tensor(const detect::TensorModule& m) {
  for (const char* suffix : {"_blocks", "weight_packed", "weight"}) {
    if (auto it = m.parts.find(suffix); it != m.parts.end()) return it->second->name;
  }
  return "";
}

// What the configs declare: nullopt when there are no configs or the dialect is unknown (nothing
// to compare). A config that cannot be read is bad input (an error), not a finding; it is read
// before any tensor so that such a directory fails at once.
Result<std::optional<detect::ConfigClaims>> read_declarations(const fs::path& dir) {
  auto config = checkpoint::read_json_file(dir / "config.json");
  if (!config.ok()) return config.error();
  auto hfq = checkpoint::read_json_file(dir / "hf_quant_config.json");
  if (!hfq.ok()) return hfq.error();
  if (config->is_null() && hfq->is_null()) return std::optional<detect::ConfigClaims>();
  auto arch = detect::read_arch(*config);
  if (!arch.ok()) return arch.error();
  auto claims = detect::read_claims(*config, *hfq, *arch);
  if (!claims.ok()) return claims.error();
  if (claims->primary.kind == detect::Section::Kind::kUnknown) {
    return std::optional<detect::ConfigClaims>();
  }
  return std::optional<detect::ConfigClaims>(std::move(*claims));
}

// The configs' declarations against the tensors. `index_modules`: the modules and tensor names
// of the index and the shards, also those of shards that are missing or unreadable, so that an
// exclusion is not reported as matching nothing because its module sits in a shard already
// reported.
void declaration_checks(const detect::ConfigClaims& claims, const detect::TensorEvidence& evidence,
                        const std::set<std::string>& index_modules, Sink& sink) {
  const detect::ArchInfo& arch = claims.arch;
  using detect::Role;
  std::set<std::string> names = index_modules;
  for (const auto& m : evidence.modules) {
    names.insert(m.name);
    const std::string weight = weight_tensor(m);
    if (weight.empty()) continue;
    const Role role = detect::classify_module(m.name, arch);
    const auto claim = claims.claim(m.name, role);
    const Scheme held = m.spec.scheme;
    const Scheme declared = claim.spec.scheme;
    const std::string says =
        std::string(to_string(declared)) + (claim.source.empty() ? "" : " (" + claim.source + ")");
    const bool fp4 = held == Scheme::kNvfp4 || held == Scheme::kMxfp4;
    if (fp4 && declared == Scheme::kBf16) {
      const bool excluded = claims.primary.excludes.match(m.name) != nullptr;
      sink.add(excluded ? "excluded_but_quantized" : "quantized_but_not_declared", 1,
               {weight, -1, -1, m.evidence + "; the configs say " + says});
    }
    const bool linear_role = role == Role::kRoutedExperts || role == Role::kSharedExperts ||
                             role == Role::kAttention || role == Role::kDenseMlp ||
                             role == Role::kMtpExperts;
    if (linear_role && held == Scheme::kBf16 && is_quantized(declared)) {
      sink.add("declared_but_not_quantized", 1,
               {weight, -1, -1, m.evidence + "; the configs declare " + says});
    }
    if (held == Scheme::kNvfp4 && claim.spec.activation == detect::Activation::kNvfp4 &&
        !m.has_input_scale) {
      sink.add("w4a4_without_input_scale", 1,
               {weight, -1, -1,
                "NVFP4 activations declared (" + claim.source +
                    "), no input_scale / input_global_scale tensor"});
    }
  }
  const auto unmatched = [&](const detect::Section& section) {
    for (const auto& pattern : section.excludes.patterns()) {
      const bool any = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
        return pattern.matches(n) || pattern.matches(n + ".weight");
      });
      if (!any) {
        sink.add("exclude_matches_nothing", 1,
                 {pattern.text(), -1, -1,
                  section.file + " " + section.excludes_key + " entry matches no module"});
      }
    }
  };
  unmatched(claims.primary);
  if (claims.sidecar) unmatched(*claims.sidecar);
}

// The shards of a directory: the index's, or every *.safetensors file. `index_modules` gets the
// modules of every tensor the index names.
Result<std::vector<std::string>> shard_names(const fs::path& dir, Sink& sink,
                                             std::set<std::string>& index_modules) {
  auto index = checkpoint::read_json_file(dir / "model.safetensors.index.json");
  if (!index.ok()) return index.error();
  std::set<std::string> names;
  if (index->is_object()) {
    const auto map = index->find("weight_map");
    if (map == index->end() || !map->is_object()) {
      return Error{(dir / "model.safetensors.index.json").string() + ": missing 'weight_map'"};
    }
    std::map<std::string, int64_t> tensors_per_shard;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        return Error{(dir / "model.safetensors.index.json").string() + ": tensor '" + tensor +
                     "': shard is not a string"};
      }
      const std::string s = shard.get<std::string>();
      if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
        return Error{(dir / "model.safetensors.index.json").string() + ": tensor '" + tensor +
                     "': shard '" + s + "' is not a file name in the checkpoint directory"};
      }
      ++tensors_per_shard[s];
      index_modules.insert(detect::split_tensor_name(tensor).first);
      index_modules.insert(tensor);  // a parameter an exclusion entry may name
    }
    std::error_code ec;
    for (const auto& [s, count] : tensors_per_shard) {
      if (!fs::exists(dir / s, ec)) {
        sink.add("shard_missing", 1,
                 {s, -1, -1, fmt::format("named by the index for {} tensors", count)});
      } else {
        names.insert(s);
      }
    }
  } else {
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0 && n[0] != '.') {
        names.insert(n);
      }
    }
  }
  return std::vector<std::string>(names.begin(), names.end());
}

}  // namespace

bool CheckReport::has_error() const {
  return std::any_of(findings.begin(), findings.end(),
                     [](const CheckFinding& f) { return f.severity == Severity::kError; });
}

int64_t CheckReport::count(std::string_view id) const {
  for (const auto& f : findings) {
    if (f.id == id) return f.count;
  }
  return 0;
}

Result<CheckReport> check_checkpoint(const fs::path& dir, const CheckOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Error{dir.string() + ": not a checkpoint directory (missing or not a directory)"};
  }
  auto declared = read_declarations(dir);
  if (!declared.ok()) return declared.error();
  Sink sink;
  std::set<std::string> index_modules;
  auto shards = shard_names(dir, sink, index_modules);
  if (!shards.ok()) return shards.error();
  if (shards->empty() && sink.by_id.empty()) {
    return Error{dir.string() + ": no *.safetensors shards: nothing to check (configs only)"};
  }
  // Every shard opened on its own: one that fails is a finding and the others are still checked.
  std::vector<SafetensorsFile> files;
  for (const auto& name : *shards) {
    auto f = SafetensorsFile::open(dir / name);
    if (!f.ok()) {
      sink.add("shard_unreadable", 1, {name, -1, -1, f.error().message});
      continue;
    }
    files.push_back(std::move(*f));
  }
  std::map<std::string, Located> located;
  std::vector<detect::TensorRecord> records;
  CheckReport report;
  for (const auto& f : files) {
    for (const auto& t : f.tensors()) {
      located[t.name] = {&f, &t};
      records.push_back({t.name, std::string(checkpoint::dtype_name(t.dtype)), t.shape});
      report.bytes_total += t.byte_size();
    }
  }
  const detect::TensorEvidence evidence = detect::classify_tensors(records);

  // Per module, on the pool; progress from the calling thread between chunks.
  std::vector<std::pair<const detect::TensorModule*, Scheme>> work;
  for (const auto& m : evidence.modules) {
    const Scheme scheme = checked_scheme(m);
    if (scheme != Scheme::kUnknown) work.push_back({&m, scheme});
  }
  std::vector<ModuleStats> stats(work.size());
  const ModuleChecker checker(located, options);
  std::optional<ThreadPool> local;
  if (options.threads > 0) local.emplace(options.threads);
  ThreadPool& pool = local ? *local : ThreadPool::global();
  // The scale grids of the next chunk of modules are read ahead while this chunk is checked, so
  // a cold page cache sees deep sequential requests rather than page faults one at a time.
  const auto read_ahead_chunk = [&](size_t begin) {
    for (size_t i = begin; i < std::min(work.size(), begin + kModulesPerProgressStep); ++i) {
      for (const auto& [suffix, t] : work[i].first->parts) {
        if (suffix != "weight_scale" && suffix != "scale" && suffix != "_scales" &&
            suffix != "weight_scale_inv") {
          continue;
        }
        // Never a hole: reading one ahead would fill the page cache with zero pages.
        if (auto it = located.find(t->name); it != located.end() && !is_hole(it->second)) {
          read_ahead(it->second.file->data(*it->second.info));
        }
      }
    }
  };
  read_ahead_chunk(0);
  uint64_t done_bytes = 0;
  for (size_t begin = 0; begin < work.size(); begin += kModulesPerProgressStep) {
    if (options.cancel != nullptr && options.cancel->load()) {
      return Error{dir.string() + ": check interrupted", ErrorKind::kInterrupted};
    }
    const size_t end = std::min(work.size(), begin + kModulesPerProgressStep);
    read_ahead_chunk(end);
    pool.run(static_cast<int64_t>(end - begin), [&](int64_t i, int) {
      const auto& [module, scheme] = work[begin + static_cast<size_t>(i)];
      stats[begin + static_cast<size_t>(i)] = checker.run(*module, scheme);
    });
    for (size_t i = begin; i < end; ++i) done_bytes += stats[i].scale_bytes + stats[i].weight_bytes;
    if (options.on_progress) options.on_progress(done_bytes, report.bytes_total);
  }
  // Tensors outside the checked modules (embeddings, norms, BF16 layers, unknown formats) are
  // not read, but one that is a file hole was never written either.
  std::set<std::string> in_work;
  for (const auto& [m, scheme] : work) {
    for (const auto& [suffix, t] : m->parts) in_work.insert(t->name);
  }
  for (const auto& [name, t] : located) {
    if (in_work.count(name) == 0 && is_hole(t)) {
      ++report.tensors_never_written;
      sink.add("all_zero_tensor", 1, {name, -1, -1, "a file hole: never written"});
    }
  }
  // Every NVFP4 activation scale exactly 1.0 is a placeholder, not a calibration.
  int64_t input_scales = 0, input_scales_one = 0;
  std::string input_scale_example;
  for (const auto& s : stats) {
    input_scales += s.nvfp4_input_scales;
    input_scales_one += s.nvfp4_input_scales_one;
    if (input_scale_example.empty() ||
        (!s.input_scale_name.empty() && s.input_scale_name < input_scale_example)) {
      input_scale_example = s.input_scale_name;
    }
  }
  if (input_scales > 0 && input_scales_one == input_scales) {
    sink.add(
        "input_scale_default", input_scales,
        {input_scale_example, -1, -1,
         fmt::format("all {} NVFP4 input scales are 1.0 (activation amax 6 * 448)", input_scales)});
  }
  for (auto& s : stats) {
    report.scale_bytes_read += s.scale_bytes;
    report.weight_bytes_read += s.weight_bytes;
    report.tensors_never_written += s.never_written;
    report.modules_checked += s.checked;
    sink.merge(std::move(s.sink));
  }
  cross_module_checks(stats, sink);
  if (*declared) {
    // Exclusion entries may name a parameter rather than a module (MiniMax-M2's
    // modules_to_not_convert lists e_score_correction_bias, a bare tensor): match tensor names too.
    for (const auto& [name, t] : located) index_modules.insert(name);
    declaration_checks(**declared, evidence, index_modules, sink);
  }

  // An input_scale that is not finite is the W4A4 finding when activations are quantized.
  if (auto it = sink.by_id.find("w4a4_input_scale_not_finite"); it != sink.by_id.end()) {
    CheckFinding moved = std::move(it->second);
    sink.by_id.erase(it);
    for (auto& e : moved.examples) {
      e.detail += " (input_scale not finite)";
      sink.add("w4a4_without_input_scale", 0, std::move(e));
    }
    sink.add("w4a4_without_input_scale", moved.count, {});
  }
  for (const auto& info : finding_table()) {
    auto it = sink.by_id.find(std::string(info.id));
    if (it == sink.by_id.end() || it->second.count == 0) continue;
    CheckFinding f = std::move(it->second);
    f.severity = info.severity;
    // Examples recorded with count 0 carry the places; entries with an empty tensor only count.
    f.examples.erase(std::remove_if(f.examples.begin(), f.examples.end(),
                                    [](const Example& e) { return e.tensor.empty(); }),
                     f.examples.end());
    if (f.summary.empty()) {
      f.summary = fmt::format("{} occurrence{}: {}", f.count, f.count == 1 ? "" : "s", info.what);
    }
    report.findings.push_back(std::move(f));
  }
  report.path = dir;
  report.sampled = !options.full;
  report.seed = options.seed;
  // What a thread holds at once: one module's scale-grid column flags (at most a byte per
  // column of its widest tensor), the sampled row indices, the code histogram and a few scalars;
  // the shards are mapped, their pages the kernel's to evict.
  int64_t widest = 0;
  for (const auto& [m, scheme] : work) {
    for (const auto& [suffix, t] : m->parts) {
      if (!t->shape.empty()) widest = std::max(widest, t->shape.back());
    }
  }
  const uint64_t sample_index_bytes =
      options.full ? 0 : 8 * sizeof(int64_t) * static_cast<uint64_t>(options.sample_rows);
  report.memory_bound_bytes =
      static_cast<uint64_t>(pool.size()) *
      (static_cast<uint64_t>(widest) + sample_index_bytes + 256 * sizeof(int64_t) + 4096);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

nlohmann::json to_json(const CheckReport& r) {
  nlohmann::json findings = nlohmann::json::array();
  for (const auto& f : r.findings) {
    const FindingInfo* info = find_finding(f.id);
    nlohmann::json examples = nlohmann::json::array();
    for (const auto& e : f.examples) {
      examples.push_back(
          {{"tensor", e.tensor},
           {"row", e.row < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.row)},
           {"block", e.block < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.block)},
           {"detail", e.detail}});
    }
    findings.push_back({{"id", f.id},
                        {"severity", to_string(f.severity)},
                        {"count", f.count},
                        {"summary", f.summary},
                        {"consequence", info ? info->consequence : ""},
                        {"fix", info ? info->fix : ""},
                        {"examples", examples}});
  }
  return {{"schema_version", 1},
          {"path", r.path.string()},
          {"verdict", r.has_error()        ? "errors"
                      : r.findings.empty() ? "clean"
                                           : "warnings"},
          {"sampled", r.sampled},
          {"seed", r.seed},
          {"modules_checked", r.modules_checked},
          {"tensors_never_written", r.tensors_never_written},
          {"scale_bytes_read", r.scale_bytes_read},
          {"weight_bytes_read", r.weight_bytes_read},
          {"bytes_total", r.bytes_total},
          {"memory_bound_bytes", r.memory_bound_bytes},
          {"seconds", r.seconds},
          {"findings", findings}};
}

std::string to_text(const CheckReport& r) {
  int errors = 0, warnings = 0;
  for (const auto& f : r.findings) (f.severity == Severity::kError ? errors : warnings) += 1;
  std::string out;
  if (errors) {
    out += fmt::format("FAIL: {} error finding{} and {} warning{} in {}\n", errors,
                       errors == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s", r.path.string());
  } else if (warnings) {
    out += fmt::format("OK with {} warning{}: {}\n", warnings, warnings == 1 ? "" : "s",
                       r.path.string());
  } else {
    out += fmt::format("OK: no findings in {}\n", r.path.string());
  }
  out += fmt::format(
      "{} quantized modules checked, {} tensors never written (file holes); {:.1f} MB of scales "
      "read in full, {:.1f} MB of weights {} (seed {:#x}), {:.2f} s\n",
      r.modules_checked, r.tensors_never_written, r.scale_bytes_read / 1e6,
      r.weight_bytes_read / 1e6, r.sampled ? "sampled" : "read in full", r.seed, r.seconds);
  for (const Severity severity : {Severity::kError, Severity::kWarning, Severity::kInfo}) {
    for (const auto& f : r.findings) {
      if (f.severity != severity) continue;
      const FindingInfo* info = find_finding(f.id);
      out += fmt::format("\n{} [{}] {}\n", to_string(f.severity), f.id, f.summary);
      for (const auto& e : f.examples) {
        out += "  " + e.tensor;
        if (e.row >= 0) out += fmt::format(" row {}", e.row);
        if (e.block >= 0) out += fmt::format(" block {}", e.block);
        out += (e.detail.empty() ? "" : ": " + e.detail) + "\n";
      }
      if (info) {
        out += fmt::format("  consequence: {}\n  fix: {}\n", info->consequence, info->fix);
      }
    }
  }
  return out;
}

}  // namespace fp4moe::check

// `fp4moe check` (check.h): shards -> tensor modules (detect/tensors.h) -> per-module scale and
// sampled-weight statistics on the thread pool -> findings; then the cross-module checks (gate/up
// pairs, magnitude outliers) and the configs' declarations against the tensors.
#include "check/check.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
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
constexpr double kOutlierRatio = 100.0;      // weight_magnitude_outlier: RMS vs peers' median
constexpr double kZeroBlockShare = 0.5;      // all_zero_blocks_share
constexpr double kConstantShare = 0.9;       // scale_range_suspicious: share of constant lines
constexpr int kMinGridForLayout = 4;         // ...judged only on grids of at least 4 x 4
constexpr size_t kModulesPerProgressStep = 64;

// A tensor of an opened shard.
struct Located {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};

// The findings of one module (or of the whole checkpoint), merged in table order at the end.
struct Sink {
  std::map<std::string, CheckFinding> by_id;
  void add(std::string_view id, int64_t count, Example example) {
    auto& f = by_id[std::string(id)];
    f.id = std::string(id);
    f.count += count;
    if (f.examples.size() < kMaxExamples) f.examples.push_back(std::move(example));
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
  Scheme scheme = Scheme::kUnknown;
  std::optional<double> tensor_scale;  // as a dequant multiplier (a CT divisor inverted)
  std::string tensor_scale_name;
  double rms = -1.0;  // of the sampled dequantized weights; < 0 when not sampled
  bool never_written = false;
  uint64_t scale_bytes = 0, weight_bytes = 0;
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

// The rows of a [rows, ...] tensor to sample: all when full or small, else `count` distinct rows
// drawn from (seed, tensor name), so the same seed picks the same rows on every run.
std::vector<int64_t> sample_rows(int64_t rows, const CheckOptions& o, std::string_view tensor) {
  std::vector<int64_t> out;
  if (o.full || rows <= o.sample_rows) {
    out.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) out[static_cast<size_t>(r)] = r;
    return out;
  }
  std::set<int64_t> picked;
  uint64_t state = o.seed ^ name_hash(tensor);
  while (static_cast<int>(picked.size()) < o.sample_rows) {
    state = splitmix(state);
    picked.insert(static_cast<int64_t>(state % static_cast<uint64_t>(rows)));
  }
  return {picked.begin(), picked.end()};
}

// Reads an F32 (or BF16/F16) scalar scale tensor.
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

bool is_hole(const Located& t) {
  return checkpoint::is_file_hole(t.file->path(),
                                  t.file->header().data_offset() + t.info->data_begin,
                                  t.info->byte_size());
}

// Whether the [rows, cols] grid of one-byte codes is constant along one axis while it varies
// along the other (scale_range_suspicious), with the evidence.
std::optional<std::string> layout_suspicion(std::span<const std::byte> codes, int64_t rows,
                                            int64_t cols) {
  if (rows < kMinGridForLayout || cols < kMinGridForLayout) return std::nullopt;
  const auto at = [&](int64_t r, int64_t c) {
    return static_cast<uint8_t>(codes[static_cast<size_t>(r * cols + c)]);
  };
  int64_t constant_rows = 0, constant_cols = 0;
  std::set<uint8_t> row_values, col_values;
  for (int64_t r = 0; r < rows; ++r) {
    bool same = true;
    for (int64_t c = 1; c < cols && same; ++c) same = at(r, c) == at(r, 0);
    constant_rows += same;
    row_values.insert(at(r, 0));
  }
  std::vector<bool> col_same(static_cast<size_t>(cols), true);
  for (int64_t r = 1; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (at(r, c) != at(0, c)) col_same[static_cast<size_t>(c)] = false;
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    constant_cols += col_same[static_cast<size_t>(c)];
    col_values.insert(at(0, c));
  }
  if (constant_rows >= kConstantShare * rows && row_values.size() > 1) {
    return fmt::format(
        "{} of {} rows hold one scale along all {} blocks of K while rows differ ({} distinct): "
        "a per-channel scale broadcast into blocks?",
        constant_rows, rows, cols, row_values.size());
  }
  if (constant_cols >= kConstantShare * cols && col_values.size() > 1) {
    return fmt::format(
        "{} of {} block columns hold one scale along all {} rows while columns differ: a "
        "transposed grid?",
        constant_cols, cols, rows);
  }
  return std::nullopt;
}

// The storage of one quantized module, located in the shards.
struct Parts {
  Located weight, scale, tensor_scale, input_scale;
  bool divisor = false;  // the tensor scale is compressed-tensors' weight_global_scale
  int64_t rows = 0, blocks_per_row = 0, row_bytes = 0;
  int block_elems = 0;  // elements per block scale along K (16, 32, 128)
};

class ModuleChecker {
 public:
  ModuleChecker(const std::map<std::string, Located>& tensors, const CheckOptions& options)
      : tensors_(tensors), options_(options) {}

  ModuleStats run(const detect::TensorModule& m) const {
    ModuleStats st;
    st.name = m.name;
    st.scheme = m.spec.scheme;
    Parts p;
    if (!locate(m, p, st)) return st;
    if (is_hole(p.weight)) {
      st.never_written = true;
      st.sink.add("all_zero_tensor", 1, {p.weight.info->name, -1, -1, "a file hole: never written"});
      return st;
    }
    check_scales(p, st);
    check_weights(p, st);
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

  bool shape_error(const Parts& p, ModuleStats& st, const std::string& why) const {
    st.sink.add("scale_shape_mismatch", 1,
                {p.scale.info ? p.scale.info->name : p.weight.info->name, -1, -1,
                 "weight " + std::string(checkpoint::dtype_name(p.weight.info->dtype)) + " " +
                     shape_text(p.weight.info->shape) +
                     (p.scale.info ? ", scale " +
                                         std::string(checkpoint::dtype_name(p.scale.info->dtype)) +
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
    switch (m.spec.scheme) {
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
        p.block_elems = 128;
        break;
      case Scheme::kFp8Tensor:
        p.tensor_scale = pick({"weight_scale"});
        p.input_scale = pick({"input_scale"});
        p.block_elems = 0;
        break;
      default:
        return false;  // not a format whose numbers this command reads
    }
    if (m.spec.scheme != Scheme::kFp8Tensor && p.scale.info == nullptr) {
      return shape_error(p, st, "no block scale tensor");
    }
    if (m.spec.scheme == Scheme::kFp8Block || m.spec.scheme == Scheme::kFp8Tensor) {
      if (w.shape.size() != 2) return shape_error(p, st, "not a 2-D weight");
      p.rows = w.shape[0];
      p.row_bytes = w.shape[1];
      if (m.spec.scheme == Scheme::kFp8Block) {
        const auto& s = p.scale.info->shape;
        const int64_t gr = (w.shape[0] + 127) / 128, gc = (w.shape[1] + 127) / 128;
        if (s.size() != 2 || s[0] != gr || s[1] != gc) {
          return shape_error(p, st, fmt::format("the 128x128 grid needs [{}, {}]", gr, gc));
        }
        p.blocks_per_row = gc;
      }
      return true;
    }
    // FP4: the scale grid [..., G] and the packed weight [..., G * block/2] (gpt-oss: [..., G, 16]).
    const auto& s = p.scale.info->shape;
    if (s.empty()) return shape_error(p, st, "scalar block scale");
    int64_t scale_rows = 1;
    for (size_t i = 0; i + 1 < s.size(); ++i) scale_rows *= s[i];
    const int64_t g = s.back();
    const int64_t bytes_per_block = p.block_elems / 2;
    if (w.byte_size() != static_cast<uint64_t>(scale_rows * g * bytes_per_block)) {
      return shape_error(
          p, st,
          fmt::format("{} blocks of {} elements need {} packed bytes, the weight has {}",
                      scale_rows * g, p.block_elems, scale_rows * g * bytes_per_block,
                      w.byte_size()));
    }
    p.rows = scale_rows;
    p.blocks_per_row = g;
    p.row_bytes = g * bytes_per_block;
    return true;
  }

  void scalar_scale(const Located& t, bool is_input, ModuleStats& st, std::string_view what,
                    bool divisor) const {
    const auto v = read_scalar(t);
    st.scale_bytes += t.info->byte_size();
    if (!v) return;
    if (!std::isfinite(*v)) {
      st.sink.add(is_input ? "w4a4_input_scale_not_finite" : "scale_not_finite", 1,
                  {t.info->name, -1, -1, fmt::format("{} = {}", what, *v)});
    } else if (*v <= 0) {
      st.sink.add("tensor_scale_nonpositive", 1,
                  {t.info->name, -1, -1, fmt::format("{} = {}", what, *v)});
    } else if (!is_input) {
      st.tensor_scale = divisor ? 1.0 / *v : *v;
      st.tensor_scale_name = t.info->name;
    }
  }

  void check_scales(const Parts& p, ModuleStats& st) const {
    if (p.tensor_scale.info) {
      scalar_scale(p.tensor_scale, false, st,
                   p.divisor ? "weight_global_scale" : "per-tensor scale", p.divisor);
    }
    if (p.input_scale.info) scalar_scale(p.input_scale, true, st, "input scale", false);
    if (p.scale.info == nullptr) return;
    const Located& s = p.scale;
    const auto bytes = s.file->data(*s.info);
    st.scale_bytes += bytes.size();
    if (is_hole(s)) return;  // reported with the weight if that is a hole too
    const int64_t cols = p.blocks_per_row;
    const int64_t rows = static_cast<int64_t>(s.info->element_count) / std::max<int64_t>(cols, 1);
    switch (s.info->dtype) {
      case DType::F8_E4M3:
      case DType::F8_E8M0:
      case DType::U8: {
        const bool e8m0 = s.info->dtype != DType::F8_E4M3;
        int64_t nan = 0;
        uint8_t max_code = 0;
        for (size_t i = 0; i < bytes.size(); ++i) {
          const auto c = static_cast<uint8_t>(bytes[i]);
          const bool is_nan = e8m0 ? c == formats::kE8M0NaN : (c & 0x7F) == 0x7F;
          if (is_nan) {
            if (nan < static_cast<int64_t>(kMaxExamples)) {
              st.sink.add("scale_nan_code", 0,
                          {s.info->name, static_cast<int64_t>(i) / cols,
                           static_cast<int64_t>(i) % cols, fmt::format("code 0x{:02X}", c)});
            }
            ++nan;
          } else if (!e8m0) {
            max_code = std::max<uint8_t>(max_code, c & 0x7F);
          }
        }
        if (nan) st.sink.add("scale_nan_code", nan, {});
        if (auto why = layout_suspicion(bytes, rows, cols)) {
          st.sink.add("scale_range_suspicious", 1, {s.info->name, -1, -1, *why});
        }
        if (!e8m0 && p.tensor_scale.info) convention(p, st, formats::decode_ue4m3(max_code));
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
          } else if (v <= 0) {
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
        break;
    }
  }

  // global_scale_convention: under NVIDIA's recipe the block holding the tensor's amax gets block
  // scale 448, so |w|max = 6 * max_block_scale * multiplier. Read the stored value both ways; the
  // convention its name says is wrong when that reading is implausible and the other is not.
  void convention(const Parts& p, ModuleStats& st, float max_block_scale) const {
    const auto v = read_scalar(p.tensor_scale);
    if (!v || !std::isfinite(*v) || *v <= 0 || max_block_scale <= 0) return;
    const double as_multiplier = 6.0 * max_block_scale * *v;
    const double as_divisor = 6.0 * max_block_scale / *v;
    const auto plausible = [](double a) { return a >= kPlausibleAmaxLow && a <= kPlausibleAmaxHigh; };
    const double named = p.divisor ? as_divisor : as_multiplier;
    const double other = p.divisor ? as_multiplier : as_divisor;
    if (!plausible(named) && plausible(other)) {
      st.sink.add("global_scale_convention", 1,
                  {p.tensor_scale.info->name, -1, -1,
                   fmt::format("{} = {:.6g}, largest block scale {:.6g}: as the {} its name says, "
                               "|w|max = {:.3g}; as a {}, |w|max = {:.3g}",
                               p.divisor ? "weight_global_scale" : "weight_scale_2", *v,
                               max_block_scale,
                               p.divisor ? "divisor (compressed-tensors)" : "multiplier (ModelOpt)",
                               named, p.divisor ? "multiplier" : "divisor", other)});
    }
  }

  // The dequantized value of packed FP4 code `q` in a block with decoded scale `s`.
  void check_weights(const Parts& p, ModuleStats& st) const {
    const Located& w = p.weight;
    const auto bytes = w.file->data(*w.info);
    const auto rows = sample_rows(p.rows, options_, w.info->name);
    const std::span<const std::byte> scales =
        p.scale.info ? p.scale.file->data(*p.scale.info) : std::span<const std::byte>{};
    const double multiplier = st.tensor_scale.value_or(1.0);
    double sum_sq = 0;
    int64_t values = 0, zero_blocks = 0, blocks = 0, not_finite = 0;
    const int64_t block_bytes = p.block_elems > 0 ? (p.block_elems == 128 ? 128 : p.block_elems / 2)
                                                  : p.row_bytes;
    for (const int64_t r : rows) {
      const auto row = bytes.subspan(static_cast<size_t>(r * p.row_bytes),
                                     static_cast<size_t>(p.row_bytes));
      st.weight_bytes += row.size();
      for (int64_t b0 = 0; b0 < p.row_bytes; b0 += block_bytes) {
        const int64_t b = b0 / block_bytes;
        const int64_t n = std::min(block_bytes, p.row_bytes - b0);
        const auto block = row.subspan(static_cast<size_t>(b0), static_cast<size_t>(n));
        ++blocks;
        const bool zero = std::all_of(block.begin(), block.end(), [](std::byte x) {
          return (static_cast<uint8_t>(x) & 0x7F) == 0;  // +-0 in every format here
        });
        if (zero) ++zero_blocks;
        double s = 1.0;
        switch (st.scheme) {
          case Scheme::kNvfp4:
            s = formats::decode_ue4m3(
                    static_cast<uint8_t>(scales[static_cast<size_t>(r * p.blocks_per_row + b)])) *
                multiplier;
            break;
          case Scheme::kMxfp4:
            s = formats::decode_e8m0(
                static_cast<uint8_t>(scales[static_cast<size_t>(r * p.blocks_per_row + b)]));
            break;
          case Scheme::kFp8Block: {
            const int64_t si = (r / 128) * p.blocks_per_row + b;
            if (p.scale.info->dtype == DType::F32) {
              float f;
              std::memcpy(&f, scales.data() + 4 * si, 4);
              s = f;
            } else {
              s = formats::decode_e8m0(static_cast<uint8_t>(scales[static_cast<size_t>(si)]));
            }
            break;
          }
          default:
            s = multiplier;
            break;
        }
        if (zero) {
          values += st.scheme == Scheme::kFp8Block || st.scheme == Scheme::kFp8Tensor ? n : 2 * n;
          continue;
        }
        for (const std::byte byte : block) {
          const auto c = static_cast<uint8_t>(byte);
          double v[2];
          int k = 0;
          if (st.scheme == Scheme::kNvfp4 || st.scheme == Scheme::kMxfp4) {
            v[k++] = formats::decode_e2m1(c & 0xF) * s;
            v[k++] = formats::decode_e2m1(c >> 4) * s;
          } else {
            v[k++] = formats::decode_e4m3(c) * s;
          }
          for (int i = 0; i < k; ++i) {
            ++values;
            if (!std::isfinite(v[i])) {
              if (not_finite++ < static_cast<int64_t>(kMaxExamples)) {
                st.sink.add("dequant_not_finite", 0,
                            {w.info->name, r, b, fmt::format("value {}", v[i])});
              }
              continue;
            }
            sum_sq += v[i] * v[i];
          }
        }
      }
    }
    if (not_finite) st.sink.add("dequant_not_finite", not_finite, {});
    if (blocks > 0 && zero_blocks == blocks) {
      st.sink.add("all_zero_tensor", 1,
                  {w.info->name, -1, -1,
                   fmt::format("all {} {} blocks are zero", blocks,
                               options_.full ? "" : "sampled")});
    } else if (blocks > 0 && zero_blocks > kZeroBlockShare * blocks) {
      st.sink.add("all_zero_blocks_share", 1,
                  {w.info->name, -1, -1,
                   fmt::format("{} of {} {}blocks are all zero ({:.0f}%)", zero_blocks, blocks,
                               options_.full ? "" : "sampled ", 100.0 * zero_blocks / blocks)});
    }
    if (values > 0) st.rms = std::sqrt(sum_sq / static_cast<double>(values));
  }

  const std::map<std::string, Located>& tensors_;
  const CheckOptions& options_;
};

bool is_quantized(Scheme s) {
  return s != Scheme::kBf16 && s != Scheme::kUnknown && s != Scheme::kAbsent;
}

// "layers.3.ffn.experts.17.w1" -> "layers.*.ffn.experts.*.w1": peers of a module.
std::string peer_key(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    if (std::isdigit(static_cast<unsigned char>(name[i]))) {
      out += '*';
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    } else {
      out += name[i++];
    }
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

void cross_module_checks(const std::vector<ModuleStats>& stats, Sink& sink) {
  std::map<std::string, const ModuleStats*> by_name;
  for (const auto& s : stats) by_name[s.name] = &s;
  // gate_up_scale_mismatch, grouped by the container ("...experts") for the per-layer counts.
  struct Pair {
    double ratio;
    std::string gate, up;
    double g, u;
  };
  std::vector<Pair> bad;
  std::map<std::string, std::pair<int64_t, int64_t>> per_layer;  // container -> (bad, pairs)
  for (const auto& s : stats) {
    const auto [base, up_name] = gate_up_pair(s.name);
    if (base.empty() || !s.tensor_scale) continue;
    auto it = by_name.find(up_name);
    if (it == by_name.end() || !it->second->tensor_scale) continue;
    const double g = *s.tensor_scale, u = *it->second->tensor_scale;
    const std::string layer = base.substr(0, base.rfind(".experts.") == std::string::npos
                                                 ? base.size()
                                                 : base.rfind(".experts.") + 8);
    auto& counts = per_layer[layer];
    ++counts.second;
    if (g != u) {
      ++counts.first;
      bad.push_back({std::max(g, u) / std::min(g, u), s.tensor_scale_name,
                     it->second->tensor_scale_name, g, u});
    }
  }
  if (!bad.empty()) {
    std::sort(bad.begin(), bad.end(), [](const Pair& a, const Pair& b) { return a.ratio > b.ratio; });
    int64_t pairs = 0, layers_hit = 0;
    for (const auto& [layer, c] : per_layer) {
      pairs += c.second;
      layers_hit += c.first > 0;
    }
    for (size_t i = 0; i < bad.size() && i < kMaxExamples; ++i) {
      const auto& b = bad[i];
      std::string layer_counts;
      for (const auto& [layer, c] : per_layer) {
        if (b.gate.rfind(layer, 0) == 0) {
          layer_counts = fmt::format("; {}: {} of {} pairs differ", layer, c.first, c.second);
        }
      }
      sink.add("gate_up_scale_mismatch", 0,
               {b.gate, -1, -1,
                fmt::format("{:.6g} vs {:.6g} ({}), ratio {:.4g}{}", b.g, b.u, b.up, b.ratio,
                            layer_counts)});
    }
    sink.add("gate_up_scale_mismatch", static_cast<int64_t>(bad.size()), {});
    sink.by_id["gate_up_scale_mismatch"].summary =
        fmt::format("{} of {} gate/up pairs in {} of {} layers differ; worst ratio {:.4g}",
                    bad.size(), pairs, layers_hit, per_layer.size(), bad.front().ratio);
  }
  // weight_magnitude_outlier against the median of the module's peers.
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
                 {s->name, -1, -1,
                  fmt::format("RMS {:.4g}, {:.3g}x the median {:.4g} of {} peers ({})", s->rms,
                              ratio, median, group.size(), key)});
      }
    }
  }
}

// The configs' declarations against the tensors.
void declaration_checks(const fs::path& dir, const detect::TensorEvidence& evidence, Sink& sink) {
  auto config = checkpoint::read_json_file(dir / "config.json");
  auto hfq = checkpoint::read_json_file(dir / "hf_quant_config.json");
  if (!config.ok() || !hfq.ok() || (config->is_null() && hfq->is_null())) return;
  auto arch = detect::read_arch(*config);
  if (!arch.ok()) return;
  auto claims = detect::read_claims(*config, *hfq, *arch);
  if (!claims.ok()) return;
  if (claims->primary.kind == detect::Section::Kind::kUnknown) return;
  using detect::Role;
  std::vector<std::string> names;
  for (const auto& m : evidence.modules) {
    names.push_back(m.name);
    if (m.parts.count("weight") == 0 && m.parts.count("weight_packed") == 0 &&
        m.parts.count("_blocks") == 0) {
      continue;
    }
    const Role role = detect::classify_module(m.name, *arch);
    const auto claim = claims->claim(m.name, role);
    const Scheme held = m.spec.scheme;
    const Scheme declared = claim.spec.scheme;
    const bool fp4 = held == Scheme::kNvfp4 || held == Scheme::kMxfp4;
    if (fp4 && declared == Scheme::kBf16) {
      const bool excluded = claims->primary.excludes.match(m.name) != nullptr;
      sink.add(excluded ? "excluded_but_quantized" : "quantized_but_not_declared", 1,
               {m.name, -1, -1, m.evidence + "; the configs say " + std::string(to_string(declared)) +
                                    (claim.source.empty() ? "" : " (" + claim.source + ")")});
    }
    const bool linear_role = role == Role::kRoutedExperts || role == Role::kSharedExperts ||
                             role == Role::kAttention || role == Role::kDenseMlp ||
                             role == Role::kMtpExperts;
    if (linear_role && held == Scheme::kBf16 && is_quantized(declared)) {
      sink.add("declared_but_not_quantized", 1,
               {m.name, -1, -1, m.evidence + "; the configs declare " +
                                    std::string(to_string(declared)) +
                                    (claim.source.empty() ? "" : " (" + claim.source + ")")});
    }
    if (held == Scheme::kNvfp4 && claim.spec.activation == detect::Activation::kNvfp4 &&
        !m.has_input_scale) {
      sink.add("w4a4_without_input_scale", 1,
               {m.name, -1, -1, "NVFP4 activations declared (" + claim.source +
                                    "), no input_scale tensor"});
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
  unmatched(claims->primary);
  if (claims->sidecar) unmatched(*claims->sidecar);
}

// The shards of a directory: the index's, or every *.safetensors file.
Result<std::vector<std::string>> shard_names(const fs::path& dir, Sink& sink) {
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
  Sink sink;
  auto shards = shard_names(dir, sink);
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
  std::vector<const detect::TensorModule*> work;
  for (const auto& m : evidence.modules) {
    if (is_quantized(m.spec.scheme)) work.push_back(&m);
  }
  std::vector<ModuleStats> stats(work.size());
  const ModuleChecker checker(located, options);
  ThreadPool local(std::max(options.threads, 1));
  ThreadPool& pool = options.threads > 0 ? local : ThreadPool::global();
  uint64_t done_bytes = 0;
  for (size_t begin = 0; begin < work.size(); begin += kModulesPerProgressStep) {
    const size_t end = std::min(work.size(), begin + kModulesPerProgressStep);
    pool.run(static_cast<int64_t>(end - begin), [&](int64_t i, int) {
      stats[begin + static_cast<size_t>(i)] = checker.run(*work[begin + static_cast<size_t>(i)]);
    });
    for (size_t i = begin; i < end; ++i) done_bytes += stats[i].scale_bytes + stats[i].weight_bytes;
    if (options.on_progress) options.on_progress(done_bytes, report.bytes_total);
  }
  for (auto& s : stats) {
    report.scale_bytes_read += s.scale_bytes;
    report.weight_bytes_read += s.weight_bytes;
    report.tensors_never_written += s.never_written;
    report.modules_checked += !s.never_written;
    sink.merge(std::move(s.sink));
  }
  cross_module_checks(stats, sink);
  declaration_checks(dir, evidence, sink);

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
  // What a thread holds at once: one module's scale-grid column flags (a byte per block column)
  // and a few scalars; the shards are mapped, their pages the kernel's to evict.
  int64_t widest = 0;
  for (const auto* m : work) {
    for (const auto& [suffix, t] : m->parts) {
      if (!t->shape.empty()) widest = std::max(widest, t->shape.back());
    }
  }
  report.memory_bound_bytes = static_cast<uint64_t>(pool.size()) *
                              (static_cast<uint64_t>(widest) * sizeof(bool) + 4096);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

nlohmann::json to_json(const CheckReport& r) {
  nlohmann::json findings = nlohmann::json::array();
  for (const auto& f : r.findings) {
    const FindingInfo* info = find_finding(f.id);
    nlohmann::json examples = nlohmann::json::array();
    for (const auto& e : f.examples) {
      examples.push_back({{"tensor", e.tensor},
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
          {"verdict", r.has_error() ? "errors" : r.findings.empty() ? "clean" : "warnings"},
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

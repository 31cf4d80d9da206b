// docs/ENGINES.md generated from the rules: per engine, the releases, the PRs and their markers,
// the detection rules by version and the kernel each method runs per architecture.
#include <fmt/core.h>
#include <fmt/format.h>

#include "engines/rules.h"

namespace fp4moe::engines {
namespace {

std::string cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string range(const std::string& first, const std::string& last) {
  if (first.empty() && last.empty()) return "all";
  if (last.empty()) return first + " ... newest";
  if (first.empty()) return "... " + last;
  return first == last ? first : first + " ... " + last;
}

std::string rule_versions(const Rule& r) {
  if (!r.pr.empty()) return "with PR #" + r.pr + " (" + range(r.first, r.last) + ")";
  if (!r.pr_absent.empty()) return "without PR #" + r.pr_absent;
  return range(r.first, r.last);
}

std::string conclusions(const Rule& r) {
  std::string out;
  for (const auto& [role, c] : r.modules) {
    if (!out.empty()) out += "; ";
    if (!c.fails.empty()) {
      out += role + ": fails (" + c.fails + ")";
    } else if (!c.not_run.empty()) {
      out += role + ": not run (" + c.not_run + ")";
    } else {
      out += fmt::format("{}: {} / {} (reads {}, activations {})", role, c.quant_config, c.method,
                         c.reads, c.activation);
    }
  }
  return out;
}

void engine_section(std::string& out, const Engine& e) {
  out += fmt::format("## {}\n\n", e.name);
  out += fmt::format("Releases the rules know: {} ({}).", fmt::join(e.releases, ", "),
                     e.releases_source);
  out += e.ran.empty() ? " None was run here: every row is read from the source.\n\n"
                       : fmt::format(" The engine's own config code was run for {}.\n\n",
                                     fmt::join(e.ran, ", "));
  if (!e.prs.empty()) {
    out += "| PR | what | merged | commit | first release | source markers |\n";
    out += "|---|---|---|---|---|---|\n";
    for (const auto& p : e.prs) {
      out +=
          fmt::format("| #{} | {} | {} | {} | {} | {} |\n", p.id, cell(p.title),
                      p.merged.empty() ? "not merged" : p.merged, p.commit.empty() ? "-" : p.commit,
                      p.first_release.empty() ? "-" : p.first_release,
                      p.markers.empty() ? "-" : fmt::format("{}", fmt::join(p.markers, ", ")));
    }
    out += "\n";
  }
  if (!e.markers.empty()) {
    out += "| marker | file | text | from | means |\n|---|---|---|---|---|\n";
    for (const auto& m : e.markers) {
      out += fmt::format("| `{}` | `{}` | `{}` | {} | {} |\n", m.id, m.file, cell(m.text),
                         range(m.first, m.last), cell(m.means));
    }
    out += "\n";
  }
  out += "Detection (first matching rule per module group, in this order):\n\n";
  out += "| rule | versions | condition | concludes | source |\n|---|---|---|---|---|\n";
  for (const auto& r : e.rules) {
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", r.id, rule_versions(r),
                       cell(r.condition.empty() ? r.when.dump() : r.condition),
                       cell(conclusions(r)), cell(r.source.cite()));
  }
  out += "\n";
  bool any_flags = false;
  for (const auto& r : e.rules) any_flags = any_flags || !r.ignored_flags.empty();
  if (any_flags) {
    out += "Flags and environment variables that do not fix it:\n\n";
    out += "| rule | flag | versions | effect | evidence |\n|---|---|---|---|---|\n";
    for (const auto& r : e.rules) {
      for (const auto& f : r.ignored_flags) {
        out += fmt::format("| `{}` | `{}` | {} | {} | {} |\n", r.id, f.flag, range(f.first, f.last),
                           cell(f.effect), cell(f.evidence));
      }
    }
    out += "\n";
  }
  out += "Kernels (per quant method and architecture; a flag selects the rows that name one):\n\n";
  out +=
      "| backend | method | versions | flags | architectures | kernel | path | precision | "
      "source |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& b : e.backends) {
    std::string archs = fmt::format("{}", fmt::join(b.archs, ", "));
    if (!b.runs_on.empty()) archs += fmt::format(" (runs only on {})", fmt::join(b.runs_on, ", "));
    if (!b.rules.empty()) archs += fmt::format(" (rule {} only)", fmt::join(b.rules, ", "));
    out += fmt::format("| `{}` | {}{}{} | {} | {} | {} | {} | {} | {} | {} |\n", b.id, b.method,
                       b.reads.empty() ? "" : " (" + b.reads + ")",
                       b.builds.empty() ? "" : " -> " + b.builds, range(b.first, b.last),
                       b.flags.empty() ? "default" : "`" + b.flags + "`", archs, cell(b.kernel),
                       path_name(b.path), b.precision, cell(b.source.cite()));
  }
  out += "\n";
}

}  // namespace

std::string contract_markdown() {
  std::string out =
      "# What SGLang, vLLM and TensorRT-LLM (GPU) and llama.cpp and kt-kernel (CPU) detect in an "
      "FP4 MoE checkpoint, by version\n\n"
      "Generated from `src/engines/rules/*.json` by `fp4moe doctor --engines-md docs/ENGINES.md`"
      " (a test regenerates it and compares); edit the rules, not this file, except the convert "
      "section at the end. Evidence: *ran* = the engine's own config code was executed on the "
      "checkpoint (CPU, no GPU); *read* = read in the released wheel; *index* = read in public "
      "sources, not run. A module group no rule covers is reported as unknown by `fp4moe plan` and "
      "`fp4moe doctor`; nothing is guessed.\n\n";
  for (const auto& e : all_engines()) engine_section(out, e);
  for (const auto& e : cpu_engines()) engine_section(out, e);
  const Engine& f = format_fallback();
  out += "## Format-level fallback (every engine, after its own rules)\n\n";
  for (const auto& r : f.rules) {
    out += fmt::format("- `{}`: {} ({})\n", r.id, conclusions(r), r.source.evidence);
  }
  for (const auto& b : f.backends) {
    out += fmt::format("- `{}`: {} on {} ({})\n", b.id, b.kernel, fmt::join(b.archs, ", "),
                       b.source.evidence);
  }
  out += "\n";
  return out;
}

}  // namespace fp4moe::engines

// `fp4moe doctor DIR [--engine PATH | --python PY]`: finds the user's serving engine (a git
// checkout, an installed package, or what python3 on PATH imports), checks the capabilities this
// checkpoint needs by the source markers of the engine rules (file:line evidence) and the PRs in
// its history, optionally runs the engine's own config resolution on the checkpoint in a
// subprocess with a timeout, and says what the engine will do, whether that is right and what to
// change. Nothing in the engine or the checkpoint is modified.
#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "detect/directory.h"
#include "engines/embedded.h"
#include "engines/rules.h"
#include "plan/plan.h"

namespace fp4moe::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct DoctorArgs {
  CheckpointArg checkpoint;
  std::string engine_path, python, engines_md, target, gpu;
  double timeout_s = 120;
  bool json = false, no_resolve = false;
};

// ---- a child process with a deadline -----------------------------------------------------------

struct RunResult {
  bool started = false, timed_out = false;
  int status = -1;  // exit status when it exited
  std::string out, err;
};

// Runs argv with stdin from /dev/null, in its own process group (a timeout kills the group).
RunResult run_process(const std::vector<std::string>& argv, double timeout_s,
                      const std::vector<std::pair<std::string, std::string>>& env = {}) {
  RunResult r;
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0) return r;
  if (pipe(err_pipe) != 0) {
    close(out_pipe[0]), close(out_pipe[1]);
    return r;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return r;
  }
  if (pid == 0) {
    setpgid(0, 0);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out_pipe[1]), close(err_pipe[1]);
  r.started = true;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  constexpr size_t kMaxOutput = 4 << 20;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      std::string& dst = i == 0 ? r.out : r.err;
      if (dst.size() < kMaxOutput) dst.append(buf, static_cast<size_t>(n));
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  if (r.timed_out) {
    waitpid(pid, &status, 0);
  } else {
    // The pipes closed; the child may still be exiting (or a grandchild kept them open).
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        r.timed_out = true;
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(10000);
    }
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (!r.timed_out && r.status == 127 && r.out.empty()) r.started = false;
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string last_line(const std::string& text) {
  const std::string t = trim(text);
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// ---- finding the engine ------------------------------------------------------------------------

struct MarkerHit {
  const engines::Marker* marker = nullptr;
  bool file_found = false;
  int line = 0;  // 0: absent
};

struct PrState {
  const engines::Pr* pr = nullptr;
  std::optional<bool> present;
  std::string evidence;
};

struct Found {
  const engines::Engine* engine = nullptr;
  std::string kind;                 // "git checkout", "site-packages", "python"
  fs::path location, package_root;  // package_root/<package>/... holds the marker files
  std::string version, version_source;
  std::string python;  // an interpreter that imports it (resolver)
  std::vector<MarkerHit> markers;
  std::vector<PrState> prs;
  engines::EngineAt at;
  std::vector<std::string> notes;
};

std::string dist_name(const engines::Engine& e) { return e.package; }

std::optional<std::string> dist_info_version(const fs::path& root, const engines::Engine& e) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = dist_name(e) + "-";
    if (name.rfind(prefix, 0) != 0 || name.size() < 10 ||
        name.substr(name.size() - 10) != ".dist-info") {
      continue;
    }
    std::ifstream in(entry.path() / "METADATA");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Version:", 0) == 0) return trim(line.substr(8).erase(0, line[8] == ' '));
    }
  }
  return std::nullopt;
}

// A package root holding `<package>/__init__.py`, from a checkout, site-packages or the package.
std::optional<fs::path> package_root(const fs::path& path, const engines::Engine& e) {
  std::error_code ec;
  const std::vector<fs::path> candidates = {path, path / e.package_dir_in_checkout,
                                            path.parent_path()};
  for (const auto& c : candidates) {
    if (c == path.parent_path() && path.filename() != e.package) continue;
    if (fs::is_regular_file(c / e.package / "__init__.py", ec)) return fs::weakly_canonical(c, ec);
  }
  return std::nullopt;
}

void scan_markers(Found& f) {
  for (const auto& m : f.engine->markers) {
    MarkerHit hit{&m, false, 0};
    std::ifstream in(f.package_root / m.file);
    if (in) {
      hit.file_found = true;
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (line.find(m.text) != std::string::npos) {
          hit.line = n;
          break;
        }
      }
    }
    f.markers.push_back(hit);
  }
}

// git describe -> release ("v0.5.13.post1-3-gabc" -> "0.5.13.post1").
std::string release_of_describe(const std::string& describe) {
  static const std::regex kTag(
      R"(^v?([0-9]+(\.[0-9]+)*(\.?(post|rc|dev)[0-9]+)?)(-[0-9]+-g[0-9a-f]+)?$)");
  std::smatch m;
  if (std::regex_match(describe, m, kTag)) return m[1];
  return "";
}

void settle_prs(Found& f, const std::optional<fs::path>& git_dir, double timeout_s) {
  for (const auto& pr : f.engine->prs) {
    PrState s{&pr, std::nullopt, ""};
    std::vector<std::string> evidence;
    // Markers first: the source itself, backports included.
    int present = 0, absent = 0;
    for (const auto& id : pr.markers) {
      for (const auto& hit : f.markers) {
        if (hit.marker->id != id) continue;
        (hit.line > 0 ? present : absent)++;
        evidence.push_back(hit.line > 0 ? fmt::format("{} at {}:{}", id, hit.marker->file, hit.line)
                                        : fmt::format("{} absent from {}", id, hit.marker->file));
      }
    }
    if (present + absent > 0) s.present = absent == 0;
    if (git_dir) {
      auto log = run_process({"git", "-C", git_dir->string(), "log", "--oneline", "-E",
                              "--grep=#" + pr.id + "([^0-9]|$)", "-n", "3"},
                             timeout_s);
      bool in_log = log.started && !log.timed_out && log.status == 0 && !trim(log.out).empty();
      if (!in_log && !pr.commit.empty()) {
        auto anc = run_process(
            {"git", "-C", git_dir->string(), "merge-base", "--is-ancestor", pr.commit, "HEAD"},
            timeout_s);
        in_log = anc.started && !anc.timed_out && anc.status == 0;
      }
      evidence.push_back(in_log ? fmt::format("git history: {}", last_line(trim(log.out)).empty()
                                                                     ? "commit " + pr.commit
                                                                     : last_line(trim(log.out)))
                                : fmt::format("git log --grep '#{}': no commit", pr.id));
      if (!s.present) s.present = in_log;
    }
    if (!s.present && !pr.first_release.empty() && !f.version.empty()) {
      s.present = engines::compare_versions(f.version, pr.first_release) >= 0;
      evidence.push_back(fmt::format("from the version ({} {} {})", f.version,
                                     *s.present ? ">=" : "<", pr.first_release));
    }
    s.evidence = fmt::format("{}", fmt::join(evidence, "; "));
    f.prs.push_back(s);
  }
  f.at.engine = f.engine;
  f.at.version = f.version.empty() ? f.engine->newest() : f.version;
  if (f.version.empty()) {
    f.notes.push_back(fmt::format("version unknown: rules without a PR condition are read at {}",
                                  f.engine->newest()));
  }
  for (const auto& s : f.prs) {
    if (s.present.value_or(false)) f.at.prs.insert(s.pr->id);
    if (s.present.value_or(false) && !f.version.empty() && !s.pr->first_release.empty() &&
        engines::compare_versions(f.version, s.pr->first_release) < 0) {
      f.notes.push_back(
          fmt::format("PR #{} is in this {} {} although it first shipped in {}: "
                      "a backport",
                      s.pr->id, f.engine->name, f.version, s.pr->first_release));
    }
  }
}

std::optional<fs::path> git_toplevel(const fs::path& path, double timeout_s) {
  auto r = run_process({"git", "-C", path.string(), "rev-parse", "--show-toplevel"}, timeout_s);
  if (!r.started || r.timed_out || r.status != 0) return std::nullopt;
  return fs::path(trim(r.out));
}

Result<std::vector<Found>> find_in_path(const fs::path& path, double timeout_s) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return Error{fmt::format("--engine {}: not a directory", path.string()), ErrorKind::kBadInput};
  }
  std::vector<Found> out;
  for (const auto& e : engines::all_engines()) {
    auto root = package_root(path, e);
    if (!root) continue;
    Found f;
    f.engine = &e;
    f.location = path;
    f.package_root = *root;
    const auto git = git_toplevel(path, std::min(timeout_s, 10.0));
    if (auto v = dist_info_version(*root, e)) {
      f.kind = "site-packages";
      f.version = *v;
      f.version_source = fmt::format("{}-{}.dist-info/METADATA", e.package, *v);
    } else if (git) {
      f.kind = "git checkout";
      auto d = run_process({"git", "-C", git->string(), "describe", "--tags", "--always"},
                           std::min(timeout_s, 10.0));
      const std::string describe = trim(d.out);
      f.version = release_of_describe(describe);
      f.version_source = fmt::format("git describe --tags: {}", describe.empty() ? "-" : describe);
    } else {
      f.kind = "source tree";
      f.version_source = "no dist-info and no git history";
    }
    scan_markers(f);
    settle_prs(f, f.kind == "git checkout" ? git : std::nullopt, std::min(timeout_s, 10.0));
    out.push_back(std::move(f));
  }
  if (out.empty()) {
    return Error{fmt::format("--engine {}: not an SGLang, vLLM or TensorRT-LLM checkout or "
                             "installation (no sglang/, python/sglang/, vllm/ or tensorrt_llm/ "
                             "package with an __init__.py)",
                             path.string()),
                 ErrorKind::kBadInput};
  }
  return out;
}

// The engines `python` imports: locations and versions from importlib, without importing them.
Result<std::vector<Found>> find_in_python(const std::string& python, double timeout_s,
                                          bool explicit_python) {
  static constexpr const char* kProbe = R"(import importlib.util, importlib.metadata, json, os
out = {}
for pkg, dist in (("sglang", "sglang"), ("vllm", "vllm"), ("tensorrt_llm", "tensorrt_llm")):
    try:
        spec = importlib.util.find_spec(pkg)
    except Exception as e:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        continue
    try:
        version = importlib.metadata.version(dist)
    except Exception:
        version = ""
    out[pkg] = {"dir": list(spec.submodule_search_locations)[0], "version": version}
print(json.dumps(out))
)";
  auto r = run_process({python, "-c", kProbe}, timeout_s);
  const std::string who = explicit_python ? "--python " + python : python + " (on PATH)";
  if (!r.started) return Error{fmt::format("{}: cannot be run", who), ErrorKind::kBadInput};
  if (r.timed_out) {
    return Error{fmt::format("{}: did not answer within {:g} s", who, timeout_s),
                 ErrorKind::kBadInput};
  }
  const json j = json::parse(last_line(r.out), nullptr, false);
  if (r.status != 0 || !j.is_object()) {
    return Error{fmt::format("{}: the package probe failed: {}", who, last_line(r.err)),
                 ErrorKind::kBadInput};
  }
  std::vector<Found> out;
  for (const auto& e : engines::all_engines()) {
    if (!j.contains(e.package)) continue;
    Found f;
    f.engine = &e;
    f.kind = "python";
    f.python = python;
    f.package_root = fs::path(j[e.package]["dir"].get<std::string>()).parent_path();
    f.location = f.package_root / e.package;
    f.version = j[e.package]["version"].get<std::string>();
    f.version_source =
        f.version.empty() ? "no distribution metadata" : "importlib.metadata (dist-info METADATA)";
    scan_markers(f);
    settle_prs(f, std::nullopt, timeout_s);
    out.push_back(std::move(f));
  }
  if (out.empty()) {
    return Error{fmt::format("{}: imports none of sglang, vllm, tensorrt_llm", who),
                 ErrorKind::kBadInput};
  }
  return out;
}

// ---- the engine's own resolution ---------------------------------------------------------------

struct Resolution {
  bool ran = false, ok = false;
  std::string error, quant_config;
  std::map<std::string, std::string> methods;
  double seconds = 0;
};

Resolution resolve(const Found& f, const fs::path& checkpoint, double timeout_s) {
  Resolution res;
  if (f.python.empty() || (f.engine->id != "sglang" && f.engine->id != "vllm")) return res;
  char tmpl[] = "/tmp/fp4moe-resolve-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) {
    res.ran = true;
    res.error = "cannot write the resolver script to /tmp";
    return res;
  }
  const std::string_view text = engines::embedded_resolver();
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  res.ran = true;
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r;
  if (written) {
    r = run_process({f.python, tmpl, "--engine", f.engine->id, checkpoint.string()}, timeout_s,
                    {{"CUDA_VISIBLE_DEVICES", ""}, {"TOKENIZERS_PARALLELISM", "false"}});
  }
  unlink(tmpl);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!written) {
    res.error = "cannot write the resolver script";
  } else if (r.timed_out) {
    res.error = fmt::format(
        "{} hung: its config resolution did not finish within {:g} s "
        "(--timeout)",
        f.engine->name, timeout_s);
  } else {
    // src/engines/resolve.py: one JSON document; "routed", "mtp" and
    // "linear" name the method classes, "error" the stage that raised.
    const json j = json::parse(trim(r.out), nullptr, false);
    if (!j.is_object()) {
      res.error = fmt::format("{} crashed (exit {}): {}", f.engine->name, r.status,
                              last_line(r.err).empty() ? "no output" : last_line(r.err));
    } else {
      res.ok = true;
      if (j.contains("error") && j["error"].is_object()) {
        res.error = fmt::format("{} raised in {}: {} {} ({})", f.engine->name,
                                j["error"].value("stage", "?"), j["error"].value("type", ""),
                                j["error"].value("message", ""), j["error"].value("at", ""));
      }
      if (!res.error.empty() && !j.contains("routed") && !j.contains("quant_config_class")) {
        res.ok = false;  // nothing was resolved: the engine could not be imported or configured
      }
      if (j.contains("quant_config_class") && j["quant_config_class"].is_string()) {
        res.quant_config = j["quant_config_class"].get<std::string>();
      }
      for (const auto& [key, role] :
           {std::pair{"routed", "routed_experts"}, std::pair{"mtp", "mtp_experts"},
            std::pair{"linear", "attention"}}) {
        if (j.contains(key) && j[key].is_object()) {
          const json& m = j[key]["method"];
          res.methods[role] = m.is_string() ? m.get<std::string>() : "none";
        }
      }
    }
  }
  return res;
}

// ---- the report --------------------------------------------------------------------------------

struct ModuleVerdict {
  const detect::ModuleGroup* group;
  engines::Verdict verdict;
};

// The kernel an engine runs for a module group on the chosen architecture (null: none named).
json backend_json(const engines::Backend* b) {
  if (b == nullptr) return nullptr;
  return {{"backend", b->id},
          {"kernel", b->kernel},
          {"path", engines::path_name(b->path)},
          {"precision", b->precision},
          {"source", b->source.cite()}};
}

int run_engines_md(const DoctorArgs& args) {
  // Keeps the hand-written convert section of the existing file (between its markers).
  static constexpr std::string_view kBegin = "<!-- convert:begin -->";
  static constexpr std::string_view kEnd = "<!-- convert:end -->";
  std::string keep = std::string(kBegin) + "\n" + std::string(kEnd) + "\n";
  std::ifstream in(args.engines_md);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string old = ss.str();
    const size_t b = old.find(kBegin), e = old.find(kEnd);
    if (b != std::string::npos && e != std::string::npos && e > b) {
      keep = old.substr(b, e + kEnd.size() - b) + "\n";
    }
  }
  fmt::print("{}## What `fp4moe convert` writes, per engine\n\n{}", engines::contract_markdown(),
             keep);
  return kExitOk;
}

int run_doctor(const DoctorArgs& args) {
  if (!args.engines_md.empty()) return run_engines_md(args);
  if (args.checkpoint.spec.empty()) {
    return report_error("doctor", Error{"a checkpoint directory is required", ErrorKind::kBadInput},
                        args.json);
  }
  if (!args.engine_path.empty() && !args.python.empty()) {
    return report_error("doctor",
                        Error{"give --engine PATH or --python PY, not both", ErrorKind::kBadInput},
                        args.json);
  }
  // The architecture the kernels are named for: plan's --target / --gpu, or none.
  auto choice = plan::parse_target_choice(args.target, args.gpu);
  if (!choice.ok()) return report_error("doctor", choice.error(), args.json);
  if (*choice && (*choice)->target == plan::Target::kCpu) {
    return report_error(
        "doctor",
        Error{"--target cpu: doctor checks a GPU serving engine (SGLang, vLLM, TensorRT-LLM); "
              "`fp4moe plan DIR --target cpu` shows what llama.cpp and kt-kernel do on the CPU",
              ErrorKind::kBadInput},
        args.json);
  }
  const std::string arch = *choice ? std::string(plan::target_name((*choice)->target)) : "";
  const std::string target_from =
      *choice ? (*choice)->from
              : "none (no --target or --gpu): no kernel is named; give --target sm_XX or --gpu "
                "NAME for the kernel and hardware path on that architecture";
  json target_json = {{"name", arch.empty() ? json(nullptr) : json(arch)},
                      {"from", target_from},
                      {"gpu", nullptr},
                      {"gpu_count", nullptr}};
  if (*choice && (*choice)->gpu) {
    target_json["gpu"] = std::string((*choice)->gpu->device.gpu);
    target_json["gpu_count"] = (*choice)->gpu->count;
  } else if (*choice && (*choice)->target != plan::Target::kCpu) {
    target_json["gpu"] = std::string(plan::default_device((*choice)->target).gpu);
    target_json["gpu_count"] = 1;
  }

  auto resolved = resolve_checkpoint_arg(args.checkpoint);
  if (!resolved.ok()) return report_error("doctor", resolved.error(), args.json);
  auto inspected = detect::detect_directory(resolved->path);
  if (!inspected.ok()) return report_error("doctor", inspected.error(), args.json);
  const engines::Facts facts = engines::make_facts(*inspected, resolved->path);

  Result<std::vector<Found>> found =
      !args.engine_path.empty() ? find_in_path(args.engine_path, args.timeout_s)
      : !args.python.empty()    ? find_in_python(args.python, args.timeout_s, true)
                                : find_in_python("python3", args.timeout_s, false);
  if (!found.ok()) {
    Error e = found.error();
    if (args.engine_path.empty() && args.python.empty()) {
      e.message += "; give --engine PATH (a checkout or site-packages) or --python PY";
    }
    return report_error("doctor", e, args.json);
  }

  bool wrong = false;
  json report = {{"schema_version", 1},
                 {"checkpoint", resolved->path.string()},
                 {"target", target_json},
                 {"engines", json::array()}};
  std::string text =
      fmt::format("target: {}{}\n", arch.empty() ? "" : arch + " from ", target_from);
  for (const Found& f : *found) {
    std::vector<ModuleVerdict> verdicts;
    for (const auto& g : inspected->manifest.modules) {
      if (g.role == detect::Role::kOther || g.spec.scheme == detect::Scheme::kAbsent) continue;
      verdicts.push_back({&g, engines::evaluate(f.at, facts, g, arch)});
    }
    const Resolution res =
        args.no_resolve ? Resolution{} : resolve(f, resolved->path, args.timeout_s);
    json ej = {{"engine", f.engine->id},
               {"name", f.engine->name},
               {"kind", f.kind},
               {"location", f.location.string()},
               {"package_root", f.package_root.string()},
               {"version", f.version},
               {"version_source", f.version_source},
               {"rules_version", f.at.version},
               {"notes", f.notes},
               {"markers", json::array()},
               {"prs", json::array()},
               {"modules", json::array()}};
    text += fmt::format("engine: {} {} ({} {}; version from {})\n", f.engine->name,
                        f.version.empty() ? "(version unknown)" : f.version, f.kind,
                        f.location.string(), f.version_source);
    text += "markers:\n";
    for (const auto& h : f.markers) {
      const std::string where = h.line > 0
                                    ? fmt::format("{}:{}", h.marker->file, h.line)
                                    : h.marker->file + (h.file_found ? "" : " (no such file)");
      text += fmt::format("  {:<36} {:<8} {}\n", h.marker->id, h.line > 0 ? "present" : "absent",
                          where);
      ej["markers"].push_back({{"id", h.marker->id},
                               {"file", h.marker->file},
                               {"text", h.marker->text},
                               {"present", h.line > 0},
                               {"file_found", h.file_found},
                               {"line", h.line > 0 ? json(h.line) : json(nullptr)},
                               {"means", h.marker->means}});
    }
    for (const auto& s : f.prs) {
      text += fmt::format("PR #{} ({}): {} [{}]\n", s.pr->id, s.pr->title,
                          !s.present   ? "unknown"
                          : *s.present ? "IN this engine"
                                       : "NOT in this engine",
                          s.evidence);
      ej["prs"].push_back({{"id", s.pr->id},
                           {"title", s.pr->title},
                           {"present", s.present ? json(*s.present) : json(nullptr)},
                           {"evidence", s.evidence}});
    }
    for (const auto& n : f.notes) text += "note: " + n + "\n";
    text += fmt::format("what {} does with this checkpoint (rules at {}):\n", f.engine->name,
                        f.at.version);
    // Text: consecutive module groups with the same verdict (w1, w2, w3) share one entry.
    auto key = [&](size_t i) {
      const auto& v = verdicts[i].verdict;
      return fmt::format("{}|{}|{}|{}|{}|{}", detect::to_string(verdicts[i].group->role),
                         detect::to_string(verdicts[i].group->spec.scheme),
                         engines::outcome_name(v.outcome), v.conclusion.method,
                         v.rule ? v.rule->id : "", v.backend ? v.backend->id : "");
    };
    for (size_t i = 0; i < verdicts.size();) {
      size_t j = i + 1;
      while (j < verdicts.size() && key(j) == key(i)) ++j;
      const ModuleVerdict& mv = verdicts[i];
      const auto& v = mv.verdict;
      const auto& c = v.conclusion;
      std::string names;
      for (size_t k = i; k < j; ++k) names += (k > i ? ", " : "") + verdicts[k].group->name;
      text += fmt::format("  {} {} ({}): ", detect::to_string(mv.group->role), names,
                          detect::to_string(mv.group->spec.scheme));
      if (v.rule == nullptr) {
        text += "unknown: " + v.why + "\n";
      } else if (!c.fails.empty()) {
        text += "FAILS: " + c.fails + "\n";
      } else {
        text += fmt::format("{}{}{} reads {} -> {}{}\n", c.quant_config,
                            c.quant_config.empty() ? "" : " / ", c.method, c.reads,
                            v.outcome == engines::Outcome::kOk ? "right" : "WRONG",
                            v.why.empty() ? "" : ": " + v.why);
      }
      if (v.rule != nullptr && v.outcome != engines::Outcome::kOk) {
        text += fmt::format("    rule {}: {}\n", v.rule->id, v.rule->source.cite());
      }
      if (!arch.empty() && v.rule != nullptr && c.fails.empty()) {
        text += v.backend == nullptr
                    ? fmt::format("    kernel on {}: unknown ({} has no kernel row for {} here)\n",
                                  arch, f.engine->name, c.method)
                    : fmt::format("    kernel on {}: {} [{}, {}] (backend {}: {})\n", arch,
                                  v.backend->kernel, engines::path_name(v.backend->path),
                                  v.backend->precision, v.backend->id, v.backend->source.cite());
        for (const engines::Backend* alt : v.alternatives) {
          text += fmt::format("    with {}: {} [{}, {}]\n", alt->flags, alt->kernel,
                              engines::path_name(alt->path), alt->precision);
        }
      }
      for (const auto& fix : v.fixes) text += "    fix: " + fix + "\n";
      i = j;
    }
    for (const auto& mv : verdicts) {
      const auto& v = mv.verdict;
      const auto& c = v.conclusion;
      json alternatives = json::array();
      for (const engines::Backend* alt : v.alternatives) {
        json a = backend_json(alt);
        a["flags"] = alt->flags;
        alternatives.push_back(a);
      }
      if (v.outcome == engines::Outcome::kWrong || v.outcome == engines::Outcome::kFails) {
        wrong = true;
      }
      ej["modules"].push_back({{"role", detect::to_string(mv.group->role)},
                               {"name", mv.group->name},
                               {"scheme", detect::to_string(mv.group->spec.scheme)},
                               {"outcome", engines::outcome_name(v.outcome)},
                               {"quant_config", c.quant_config},
                               {"method", c.method},
                               {"reads", c.reads},
                               {"rule", v.rule ? v.rule->id : ""},
                               {"rule_source", v.rule ? v.rule->source.cite() : ""},
                               {"why", v.why},
                               {"fixes", v.fixes},
                               {"kernel", backend_json(v.backend)},
                               {"alternatives", alternatives}});
    }
    json rj = {{"ran", res.ran}, {"ok", res.ok}};
    if (!res.ran) {
      text += f.python.empty() ? "engine's own resolution: not run (markers only; --python PY "
                                 "runs it)\n"
                               : "engine's own resolution: not run\n";
    } else if (!res.ok) {
      text += "engine's own resolution: FAILED: " + res.error + "\n";
      rj["error"] = res.error;
    } else {
      if (!res.error.empty()) {
        text += "engine's own resolution stopped early: " + res.error + "\n";
        rj["error"] = res.error;
      }
      text += fmt::format("engine's own resolution ({:.1f} s): quant config {}\n", res.seconds,
                          res.quant_config);
      rj["quant_config"] = res.quant_config;
      rj["methods"] = res.methods;
      rj["seconds"] = res.seconds;
      json agree = json::object();
      for (const auto& [role, method] : res.methods) {
        const ModuleVerdict* pred = nullptr;
        for (const auto& mv : verdicts) {
          if (detect::to_string(mv.group->role) == role && mv.verdict.rule) pred = &mv;
        }
        const std::string predicted = pred ? pred->verdict.conclusion.method : "";
        const bool same = !predicted.empty() && predicted == method;
        agree[role] = predicted.empty() ? json(nullptr) : json(same);
        text += fmt::format("  {}: {} (rules predict {}{})\n", role, method,
                            predicted.empty() ? "nothing" : predicted,
                            predicted.empty() ? ""
                            : same            ? ": agree"
                                              : ": DISAGREE");
      }
      rj["agrees"] = agree;
    }
    ej["resolution"] = rj;
    report["engines"].push_back(ej);
    text += "\n";
  }
  report["verdict"] = wrong ? "wrong" : "ok";
  if (args.json) {
    fmt::print("{}\n", report.dump(2));
  } else {
    text += wrong ? "verdict: WRONG: the engine misroutes or refuses module groups above (exit 1)\n"
                  : "verdict: no wrong route found\n";
    fmt::print("{}", text);
  }
  return wrong ? kExitFailed : kExitOk;
}

const CommandRegistrar kDoctor{
    {"doctor",
     "Find your serving engine and say what it will do with this checkpoint, by its own source",
     [](CLI::App& app) {
       auto args = std::make_shared<DoctorArgs>();
       add_checkpoint_arg(app, args->checkpoint, "DIR",
                          "checkpoint directory or Hugging Face repo id", false);
       app.add_option("--engine", args->engine_path,
                      "an engine git checkout, site-packages directory or package directory");
       app.add_option("--python", args->python,
                      "an interpreter whose engines to check (default: python3 on PATH); its "
                      "engine's own config resolution is run on the checkpoint");
       app.add_option("--timeout", args->timeout_s,
                      "seconds for each subprocess (python probe, git, the engine's resolution)")
           ->check(CLI::PositiveNumber);
       app.add_option("--target", args->target,
                      "sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120 or sm_121: name the "
                      "kernel and hardware path the engine runs there (as `plan --target`)");
       app.add_option("--gpu", args->gpu,
                      "NAME[xN] from plan's GPU table (A100, RTX 3090, L40S, H100, H200, B200, "
                      "B300, RTX PRO 6000, RTX 5090, GB10): its architecture is the target");
       app.add_flag("--no-resolve", args->no_resolve,
                    "markers only: do not run the engine's config resolution");
       app.add_flag("--json", args->json, "print the report as JSON");
       app.add_option("--engines-md", args->engines_md,
                      "print docs/ENGINES.md regenerated from the rules, keeping FILE's convert "
                      "section");
       return [args] { return run_doctor(*args); };
     },
     25}};

}  // namespace
}  // namespace fp4moe::cli

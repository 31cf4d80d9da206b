// Hugging Face hub cache: its location, repo folders, refs and snapshots (hf_cache.h).
#include "checkpoint/hf_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <vector>

namespace fp4moe::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kRepoPrefix = "models--";

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// os.path.expanduser for the forms a cache variable holds: "~" and "~/...".
fs::path expand_user(std::string_view p) {
  if (p == "~" || p.starts_with("~/")) {
    const char* home = env("HOME");
    if (home != nullptr) return fs::path(home) / std::string(p.substr(p.size() > 1 ? 2 : 1));
  }
  return fs::path(std::string(p));
}

bool is_commit_hash(std::string_view s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

// A revision or ref is a relative path below refs/ (branches may hold '/': "refs/pr/1").
bool is_safe_relative(std::string_view s) {
  if (s.empty() || s.front() == '/') return false;
  for (const fs::path& part : fs::path(std::string(s))) {
    if (part.empty() || part == ".." || part == ".") return false;
  }
  return s.find('\0') == std::string_view::npos;
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// "refs main -> 0123abc, snapshots 0123abc..." for an error naming what the cache holds.
std::string cached_revisions(const fs::path& repo) {
  std::vector<std::string> refs, snapshots;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(repo / "refs", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    std::ifstream in(it->path());
    std::string commit;
    std::getline(in, commit);
    refs.push_back(fs::relative(it->path(), repo / "refs", ec).string() + " -> " +
                   trimmed(commit).substr(0, 12));
  }
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec)) {
    snapshots.push_back(e.path().filename().string());
  }
  std::sort(refs.begin(), refs.end());
  std::sort(snapshots.begin(), snapshots.end());
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out.empty() ? std::string("none") : out;
  };
  return "refs: " + join(refs) + "; snapshots: " + join(snapshots);
}

// A repo folder of the cache at `revision`.
Result<ResolvedCheckpoint> resolve_in_repo(const fs::path& repo, std::string repo_id,
                                           std::string_view revision) {
  ResolvedCheckpoint r;
  r.repo_id = std::move(repo_id);
  r.revision = revision.empty() ? "main" : std::string(revision);
  const std::string who = "'" + r.repo_id + "' (" + repo.string() + ")";
  if (!is_safe_relative(r.revision)) {
    return Error{who + ": revision '" + r.revision + "' is not a branch, tag or commit hash"};
  }
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) {
    return Error{who + ": no snapshots/ folder: not a Hugging Face cache repo, or nothing of it " +
                 "was downloaded"};
  }
  const fs::path ref = repo / "refs" / r.revision;
  if (fs::is_regular_file(ref, ec)) {
    std::ifstream in(ref);
    std::string commit;
    std::getline(in, commit);
    commit = trimmed(commit);
    if (!is_safe_relative(commit) || commit.find('/') != std::string::npos) {
      return Error{ref.string() + ": does not hold a commit hash"};
    }
    r.commit = commit;
    if (!fs::is_directory(repo / "snapshots" / commit, ec)) {
      return Error{who + ": refs/" + r.revision + " names commit " + commit + " but snapshots/" +
                   commit + " is missing (the download did not finish; " + cached_revisions(repo) +
                   ")"};
    }
  } else if (is_commit_hash(r.revision) && fs::is_directory(repo / "snapshots" / r.revision, ec)) {
    r.commit = r.revision;
  } else {
    return Error{who + ": revision '" + r.revision + "' is not in the cache (no refs/" +
                 r.revision + (is_commit_hash(r.revision) ? ", no snapshots/" + r.revision : "") +
                 "; " + cached_revisions(repo) + ")"};
  }
  r.path = repo / "snapshots" / r.commit;
  return r;
}

}  // namespace

HfCacheLocation hf_cache_location() {
  if (const char* v = env("HF_HUB_CACHE")) return {expand_user(v), "HF_HUB_CACHE"};
  if (const char* v = env("HUGGINGFACE_HUB_CACHE"))
    return {expand_user(v), "HUGGINGFACE_HUB_CACHE"};
  if (const char* v = env("HF_HOME")) return {expand_user(v) / "hub", "HF_HOME/hub"};
  if (const char* v = env("XDG_CACHE_HOME")) {
    return {expand_user(v) / "huggingface" / "hub", "XDG_CACHE_HOME/huggingface/hub"};
  }
  return {expand_user("~/.cache/huggingface/hub"), "~/.cache/huggingface/hub"};
}

bool is_hf_repo_id(std::string_view text) {
  auto part_ok = [](std::string_view p) {
    if (p.empty() || p.size() > 96 || p.front() == '.' || p.front() == '-') return false;
    if (p.find("--") != std::string_view::npos || p.find("..") != std::string_view::npos) {
      return false;
    }
    return std::all_of(p.begin(), p.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
  };
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return part_ok(text);
  return part_ok(text.substr(0, slash)) && part_ok(text.substr(slash + 1));
}

std::string hf_repo_folder_name(std::string_view repo_id) {
  std::string out(kRepoPrefix);
  for (char c : repo_id) {
    if (c == '/') {
      out += "--";
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<fs::path> hf_snapshot_blobs(const fs::path& canonical_dir) {
  // Walk up to ".../models--x--y/snapshots/<commit>".
  for (fs::path p = canonical_dir; p.has_parent_path() && p != p.parent_path();
       p = p.parent_path()) {
    const fs::path snapshots = p.parent_path();
    if (snapshots.filename() != "snapshots") continue;
    const fs::path repo = snapshots.parent_path();
    if (!repo.filename().string().starts_with(kRepoPrefix)) continue;
    const fs::path blobs = repo / "blobs";
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(blobs, ec);
    if (ec || st.type() != fs::file_type::directory) return std::nullopt;
    return blobs;
  }
  return std::nullopt;
}

Result<ResolvedCheckpoint> resolve_checkpoint(std::string_view argument,
                                              std::string_view revision) {
  const std::string arg(argument);
  if (arg.empty()) return Error{"empty checkpoint argument"};
  std::error_code ec;
  const fs::file_status st = fs::status(arg, ec);
  if (st.type() == fs::file_type::directory) {
    const fs::path canonical = fs::canonical(arg, ec);
    if (ec) return Error{arg + ": cannot resolve: " + ec.message()};
    const std::string name = canonical.filename().string();
    if (name.starts_with(kRepoPrefix) && fs::is_directory(canonical / "snapshots", ec)) {
      // A cache repo folder: "models--org--name" -> "org/name".
      std::string id = name.substr(kRepoPrefix.size());
      if (const size_t sep = id.find("--"); sep != std::string::npos) id.replace(sep, 2, "/");
      return resolve_in_repo(canonical, id, revision);
    }
    if (!revision.empty()) {
      return Error{arg + ": --revision '" + std::string(revision) +
                   "' applies to a repo id or a cache repo folder (models--org--name), not to a "
                   "checkpoint directory"};
    }
    ResolvedCheckpoint r;
    r.path = arg;
    return r;
  }
  if (st.type() != fs::file_type::not_found && st.type() != fs::file_type::none) {
    return Error{arg + ": not a directory"};
  }
  if (!is_hf_repo_id(arg)) {
    return Error{arg +
                 ": not a checkpoint directory (no such directory), nor a Hugging Face "
                 "repo id (org/name)"};
  }
  const HfCacheLocation cache = hf_cache_location();
  const fs::path repo = cache.dir / hf_repo_folder_name(arg);
  if (!fs::is_directory(repo, ec)) {
    return Error{arg + ": no such directory, and repo '" + arg +
                 "' is not in the Hugging Face cache (looked for " + repo.string() +
                 "; the cache is " + cache.source + "). Download it first (`hf download " + arg +
                 "`, or with --include '*.json' for its configs only) or pass a checkpoint "
                 "directory"};
  }
  return resolve_in_repo(repo, arg, revision);
}

}  // namespace fp4moe::checkpoint

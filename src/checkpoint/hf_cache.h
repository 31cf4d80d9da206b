// The Hugging Face hub cache as huggingface_hub writes it, and repo ids resolved through it.
//
//   <cache>/models--<org>--<name>/refs/<revision>           one line: the commit hash
//   <cache>/models--<org>--<name>/snapshots/<commit>/<file>  symlink -> ../../blobs/<etag>
//   <cache>/models--<org>--<name>/blobs/<etag>               the bytes
//
// <cache> is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (huggingface_hub.constants,
// `~` expanded). A snapshot's symlinks that resolve into its own repo's blobs/ are the cache's
// own; every other symlink leaving a checkpoint directory stays an error (checkpoint_dir.h).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fp4moe::checkpoint {

struct HfCacheLocation {
  std::filesystem::path dir;
  std::string source;  // "HF_HUB_CACHE", "HF_HOME/hub", "~/.cache/huggingface/hub", ...
};

// Where huggingface_hub keeps its cache under the current environment.
HfCacheLocation hf_cache_location();

// "org/name" or "name": letters, digits, '.', '_', '-', not starting with '.' or '-', no "--" or
// "..", at most 96 characters per part (the Hub's own rules).
bool is_hf_repo_id(std::string_view text);

// "models--org--name" for "org/name".
std::string hf_repo_folder_name(std::string_view repo_id);

// For a canonical directory inside a cache snapshot (".../models--x--y/snapshots/<commit>" or a
// subfolder of it): that repo's blobs/ directory, the only place its symlinks may resolve to.
// nullopt for any other directory, or when blobs/ is itself a symlink.
std::optional<std::filesystem::path> hf_snapshot_blobs(const std::filesystem::path& canonical_dir);

// What a command's checkpoint argument named.
struct ResolvedCheckpoint {
  std::filesystem::path path;  // the directory to read
  std::string repo_id;         // "" when the argument was a plain checkpoint directory
  std::string revision;        // as asked ("main" by default); "" for a plain directory
  std::string commit;          // the snapshot's commit hash; "" for a plain directory
};

// A checkpoint argument: an existing directory (a checkpoint, or a cache repo folder
// "models--org--name", which is resolved like its repo id), else a repo id looked up in the cache
// at `revision` ("" = main; a branch or tag through refs/, or a 40-hex commit hash). Errors say
// where they looked: the repo folder and the cache's source, the refs and snapshots present.
Result<ResolvedCheckpoint> resolve_checkpoint(std::string_view argument, std::string_view revision);

}  // namespace fp4moe::checkpoint

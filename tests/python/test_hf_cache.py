"""Hugging Face cache and repo ids, against the huggingface_hub package itself: the cache tree is
written with huggingface_hub's own helpers (the calls hf_hub_download makes after a download),
scan_cache_dir must list it, and snapshot_download(local_files_only=True) must return the snapshot
directory fp4moe resolves for the same repo id and revision."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from st_io import save as save_file

from huggingface_hub import file_download, scan_cache_dir, snapshot_download

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release"))
BIN = BUILD / "fp4moe"
CORPUS = ROOT / "tests" / "data" / "corpus"
COMMIT = "a" * 40
OLD_COMMIT = "b" * 40


def fp4moe(*args, env=None):
    if not BIN.exists():
        pytest.fail(f"{BIN} not built (build target fp4moe, or set FP4MOE_BUILD_DIR)")
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, env=env)


def cache_file(cache, repo_id, commit, filename, data: bytes, ref=None):
    """Stores one file the way hf_hub_download does once the bytes are in: the blob under its
    etag, a relative symlink from snapshots/<commit>/<filename>, and refs/<ref> -> commit."""
    storage = os.path.join(cache, file_download.repo_folder_name(repo_id=repo_id, repo_type="model"))
    etag = hashlib.sha256(data).hexdigest()  # an LFS file's etag is its sha256
    blob = os.path.join(storage, "blobs", etag)
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    tmp = blob + ".incomplete"
    with open(tmp, "wb") as f:
        f.write(data)
    pointer = file_download._get_pointer_path(storage, commit, filename)
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    os.replace(tmp, blob)  # hf_hub_download: .incomplete renamed into blobs/ when complete
    file_download._create_symlink(blob, pointer, new_blob=False)
    if ref is not None:
        file_download._cache_commit_hash_for_specific_revision(storage, ref, commit)
    return pathlib.Path(storage)


def qwen3_moe_files(tmp_path):
    """A tiny BF16 Qwen3-MoE checkpoint (config, index, one shard) as bytes by file name."""
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 1, "num_experts": 2,
              "hidden_size": 8, "moe_intermediate_size": 4, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16, "num_experts_per_tok": 1}
    tensors = {f"model.layers.0.mlp.experts.{e}.{m}.weight": np.zeros((4, 8), np.float32)
               for e in range(2) for m in ("gate_proj", "up_proj")}
    tensors.update({f"model.layers.0.mlp.experts.{e}.down_proj.weight": np.zeros((8, 4), np.float32)
                    for e in range(2)})
    shard = tmp_path / "shard.safetensors"
    save_file(tensors, str(shard))
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": {name: "model-00001-of-00001.safetensors" for name in tensors}}
    return {"config.json": json.dumps(config).encode(),
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00001.safetensors": shard.read_bytes()}


@pytest.fixture
def hub(tmp_path):
    """A cache with org/tiny at COMMIT (main: configs, index and shard) and OLD_COMMIT (branch
    v1: configs and index only, shards not downloaded)."""
    cache = tmp_path / "hub"
    files = qwen3_moe_files(tmp_path)
    for name, data in files.items():
        cache_file(str(cache), "org/tiny", COMMIT, name, data, ref="main")
    for name in ("config.json", "model.safetensors.index.json"):
        cache_file(str(cache), "org/tiny", OLD_COMMIT, name, files[name], ref="v1")
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return cache, env


def test_huggingface_hub_recognises_the_tree(hub):
    cache, _ = hub
    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "org/tiny" and repo.repo_type == "model"
    revisions = {r.commit_hash: r for r in repo.revisions}
    assert set(revisions) == {COMMIT, OLD_COMMIT}
    assert revisions[COMMIT].refs == frozenset({"main"})
    assert revisions[OLD_COMMIT].refs == frozenset({"v1"})
    # Every snapshot file is a symlink into the repo's own blobs/.
    for f in revisions[COMMIT].files:
        assert f.file_path.is_symlink()
        assert f.blob_path.parent == cache / "models--org--tiny" / "blobs"


@pytest.mark.parametrize("revision,commit", [(None, COMMIT), ("main", COMMIT), ("v1", OLD_COMMIT),
                                             (OLD_COMMIT, OLD_COMMIT)])
def test_resolves_to_the_snapshot_huggingface_hub_returns(hub, revision, commit):
    cache, env = hub
    expected = snapshot_download("org/tiny", revision=revision, cache_dir=str(cache),
                                 local_files_only=True)
    args = ["inspect", "org/tiny", "--json"] + (["--revision", revision] if revision else [])
    r = fp4moe(*args, env=env)
    assert r.returncode == 0, r.stderr
    source = json.loads(r.stdout)["source"]
    assert source["path"] == expected
    assert source["repo_id"] == "org/tiny" and source["commit"] == commit
    assert source["revision"] == (revision or "main")


def test_every_checkpoint_command_takes_a_repo_id(hub, tmp_path):
    cache, env = hub
    j = json.loads(fp4moe("inspect", "org/tiny", "--json", env=env).stdout)
    assert j["tensor_evidence"] == "headers" and j["tensors_checked"]
    assert j["summary"]["routed_experts"] == "bf16"
    check = fp4moe("check", "org/tiny", "--json", env=env)
    assert check.returncode in (0, 1), check.stderr
    assert json.loads(check.stdout)["source"]["repo_id"] == "org/tiny"
    plan = fp4moe("plan", "org/tiny", "--target", "sm_90", "--json", env=env)
    assert plan.returncode in (0, 1), plan.stderr
    assert "not a directory" not in plan.stderr
    # The configs-only revision: the index's names are the evidence, the shard is not downloaded.
    old = json.loads(fp4moe("inspect", "org/tiny", "--revision", "v1", "--json", env=env).stdout)
    assert old["tensor_evidence"] == "index_names" and not old["tensors_checked"]
    assert any(f["code"] == "not_downloaded" for f in old["findings"])
    assert old["total_bytes"] == j["total_bytes"]
    # HF_HOME/hub when HF_HUB_CACHE is not set.
    home = tmp_path / "hfhome"
    shutil.copytree(cache, home / "hub", symlinks=True)
    env2 = {k: v for k, v in env.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env2["HF_HOME"] = str(home)
    r = fp4moe("inspect", "org/tiny", "--json", env=env2)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"]["path"].startswith(str(home / "hub"))


def test_clear_errors(hub):
    cache, env = hub
    missing = fp4moe("inspect", "org/absent", env=env)
    assert missing.returncode == 2
    assert str(cache / "models--org--absent") in missing.stderr and "HF_HUB_CACHE" in missing.stderr
    rev = fp4moe("inspect", "org/tiny", "--revision", "v9", "--json", env=env)
    assert rev.returncode == 2
    err = json.loads(rev.stdout)["error"]
    assert err["kind"] == "bad_input" and "revision 'v9'" in err["message"] and "main" in err["message"]
    neither = fp4moe("inspect", "./not/a/dir/or/repo", env=env)
    assert neither.returncode == 2 and "nor a Hugging Face repo id" in neither.stderr


def test_a_hostile_symlink_in_a_snapshot_is_refused(hub, tmp_path):
    cache, env = hub
    snapshot = cache / "models--org--tiny" / "snapshots" / COMMIT
    outside = tmp_path / "outside.safetensors"
    shutil.copy(snapshot / "model-00001-of-00001.safetensors", outside)
    (snapshot / "model-00001-of-00001.safetensors").unlink()
    (snapshot / "model-00001-of-00001.safetensors").symlink_to(outside)
    r = fp4moe("inspect", "org/tiny", env=env)
    assert r.returncode == 2
    assert "outside the checkpoint directory (symlink)" in r.stderr and "blobs" in r.stderr

"""The JSON contract (docs/JSON.md): inspect --json of every corpus directory and of fixtures
validates against docs/schema/inspect.schema.json (and plan --json against
docs/schema/plan.schema.json where that file exists); every command with --json prints the error
object of docs/schema/error.schema.json on error; the enums of the docs and the schemas agree; one
exit-code table in --help and the README, and every command keeps to it."""
import json
import os
import pathlib
import re
import subprocess

import jsonschema
import numpy as np
import pytest

from conftest import synth_layouts

from st_io import save as save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release"))
BIN = BUILD / "fp4moe"
CORPUS = ROOT / "tests" / "data" / "corpus"
SCHEMAS = ROOT / "docs" / "schema"
CORPUS_DIRS = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
SYNTH_LAYOUTS = synth_layouts()


def fp4moe(*args, env=None):
    if not BIN.exists():
        pytest.fail(f"{BIN} not built (build target fp4moe, or set FP4MOE_BUILD_DIR)")
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, env=env)


def validator(name):
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate(name, instance):
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def inspect_json(path, *extra):
    r = fp4moe("inspect", path, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", CORPUS_DIRS)
def test_corpus_inspect_matches_the_schema(name):
    j = inspect_json(CORPUS / name)
    validate("inspect", j)
    assert j["schema_version"] == 1
    assert j["tensor_evidence"] == "none" and not j["tensors_checked"]


@pytest.mark.parametrize("name", CORPUS_DIRS)
def test_corpus_plan_matches_its_schema_where_there_is_one(name):
    if not (SCHEMAS / "plan.schema.json").exists():
        pytest.skip("docs/schema/plan.schema.json is not written yet")
    r = fp4moe("plan", CORPUS / name, "--target", "sm_100", "--json")
    assert r.returncode in (0, 1), r.stderr
    validate("plan", json.loads(r.stdout))


@pytest.fixture(scope="module")
def synth_dirs(module_tmp):
    base = module_tmp("synth")
    out = {}
    for layout in SYNTH_LAYOUTS:
        r = fp4moe("synth", layout, base / layout)
        assert r.returncode == 0, r.stderr
        out[layout] = base / layout
    return out


@pytest.mark.parametrize("layout", SYNTH_LAYOUTS)
def test_fixture_inspect_matches_the_schema(synth_dirs, layout):
    j = inspect_json(synth_dirs[layout])
    validate("inspect", j)
    assert j["tensor_evidence"] == "headers" and j["tensors_checked"]
    assert j["total_bytes"] > 0 and j["total_bytes_source"] == "safetensors headers"
    assert all(m["bytes"] is not None and m["bytes_source"] == "safetensors headers"
               for m in j["modules"])


@pytest.mark.parametrize("layout", SYNTH_LAYOUTS)
def test_configs_and_index_only_matches_the_schema(synth_dirs, layout, tmp_path):
    """The same checkpoint before its shards are downloaded: configs and the index only."""
    src = synth_dirs[layout]
    for f in src.iterdir():
        if f.suffix == ".json":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    full = inspect_json(src)
    if not (tmp_path / "model.safetensors.index.json").exists():
        # A single-file checkpoint: write the index the way transformers does for sharded ones.
        header_len = int.from_bytes((src / "model.safetensors").read_bytes()[:8], "little")
        header = json.loads((src / "model.safetensors").read_bytes()[8:8 + header_len])
        names = [k for k in header if k != "__metadata__"]
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": full["total_bytes"]},
             "weight_map": {n: "model.safetensors" for n in names}}))
    j = inspect_json(tmp_path)
    validate("inspect", j)
    assert j["tensor_evidence"] == "index_names"
    assert any(f["code"] == "not_downloaded" for f in j["findings"])
    # The schemes the headers give, the names and configs give too.
    assert j["summary"] == full["summary"], (j["summary"], full["summary"])


def test_index_errors_name_the_file_and_entry(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    for weight_map, reason in [({"t": "../x.safetensors"}, "'..' leaves the checkpoint directory"),
                               ({"t": "/abs.safetensors"}, "absolute path")]:
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        r = fp4moe("inspect", tmp_path, "--json")
        assert r.returncode == 2
        msg = json.loads(r.stdout)["error"]["message"]
        assert "model.safetensors.index.json" in msg and "tensor 't'" in msg and reason in msg
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {')
    r = fp4moe("inspect", tmp_path)
    assert r.returncode == 2 and "model.safetensors.index.json: invalid JSON" in r.stderr


def bytes_per_token_figures(plan_json):
    """Every bytes_per_token in a plan --json, wherever the plan's layout puts them."""
    out = []
    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "bytes_per_token":
                    out.append(x)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(plan_json)
    return out


def test_plan_prints_numbers_before_any_download():
    """Configs only: bytes per token from the config's dimensions, never a made-up 0."""
    r = fp4moe("plan", CORPUS / "nvidia__Qwen3-235B-A22B-NVFP4", "--target", "sm_100", "--json")
    assert r.returncode in (0, 1), r.stderr
    figures = bytes_per_token_figures(json.loads(r.stdout))
    assert figures and all(f is not None and f > 0 for f in figures), figures
    # 22B active parameters at ~4.5 bits plus the BF16 head: well over 10 GB per token.
    assert max(figures) > 10e9, figures
    text = fp4moe("plan", CORPUS / "nvidia__Qwen3-235B-A22B-NVFP4", "--target", "sm_100").stdout
    assert " 0.0 MB" not in text


def test_unknown_prints_unknown(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_moe", "num_hidden_layers": 1, "num_experts": 2}))  # no dimensions
    j = inspect_json(tmp_path)
    validate("inspect", j)
    assert j["total_bytes"] is None
    assert all(m["bytes"] is None and m["bytes_source"].startswith("unknown") for m in j["modules"])
    r = fp4moe("plan", tmp_path, "--target", "sm_100", "--json")
    assert r.returncode in (0, 1), r.stderr
    figures = bytes_per_token_figures(json.loads(r.stdout))
    assert figures and all(f is None for f in figures), figures  # unknown, never 0
    text = fp4moe("plan", tmp_path, "--target", "sm_100", "--engine", "vllm").stdout
    assert "unknown" in text and " 0.000 " not in text, text


# Every command with --json, given input it cannot read.
ERROR_CASES = [
    ("inspect", ["inspect", "{missing}", "--json"]),
    ("check", ["check", "{missing}", "--json"]),
    ("plan", ["plan", "{missing}", "--target", "sm_90", "--json"]),
    ("verify", ["verify", "{missing}", "--json"]),
    ("bench", ["bench", "--checkpoint", "{missing}", "--json"]),
    ("convert", ["convert", "{missing}", "{dst}", "--json"]),
    ("doctor", ["doctor", "{missing}", "--json"]),
    ("inspect-revision", ["inspect", "{corpus}", "--revision", "main", "--json"]),
    ("plan-target", ["plan", "{corpus}", "--target", "sm_75", "--json"]),
    ("usage", ["inspect", "--json"]),
    ("unknown-option", ["check", "--no-such-option", "--json"]),
]


@pytest.mark.parametrize("name,argv", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_every_json_command_prints_an_error_object(tmp_path, name, argv):
    subst = {"missing": tmp_path / "no-such-checkpoint", "dst": tmp_path / "out",
             "corpus": CORPUS / "openai__gpt-oss-20b"}
    r = fp4moe(*[a.format(**subst) for a in argv])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.strip()
    j = json.loads(r.stdout)
    validate("error", j)
    assert j["error"]["kind"] == "bad_input"


def doc_enums():
    text = (ROOT / "docs" / "JSON.md").read_text()
    section = text.split("## Enumerations", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        m = re.match(r"^\| ([a-z_]+) \| (`.*`) \|$", line)
        if m:
            out[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
    return out


def test_docs_and_schemas_list_the_same_enums():
    doc = doc_enums()
    inspect = json.loads((SCHEMAS / "inspect.schema.json").read_text())["$defs"]
    for name in ("scheme", "kv_cache", "role", "activation", "scale_type", "severity",
                 "tensor_evidence"):
        assert inspect[name]["enum"] == doc[name], name
    error = json.loads((SCHEMAS / "error.schema.json").read_text())
    assert error["properties"]["error"]["properties"]["kind"]["enum"] == doc["error_kind"]


def exit_table_rows(text):
    return re.findall(r"^ {2}(\d+) +(.+)$", text, re.M)


def test_one_exit_code_table_in_help_and_readme():
    top = fp4moe("--help")
    assert top.returncode == 0
    rows = exit_table_rows(top.stdout)
    assert [code for code, _ in rows] == ["0", "1", "2", "130"], top.stdout
    readme = (ROOT / "README.md").read_text()
    for code, meaning in rows:
        assert f"| {code} |" in readme, code
    for cmd in ("inspect", "check", "plan", "convert", "verify", "bench", "synth", "demo",
                "doctor"):
        h = fp4moe(cmd, "--help")
        assert h.returncode == 0, cmd
        assert exit_table_rows(h.stdout) == rows, cmd


def test_exit_codes_of_every_command(tmp_path):
    """0 ok, 1 a check failed, 2 bad input or usage (130 is covered by the convert interrupt
    tests)."""
    gptoss = CORPUS / "openai__gpt-oss-20b"
    missing = tmp_path / "nothing"
    cases = [
        (0, ["inspect", gptoss]),
        (2, ["inspect", missing]),
        (0, ["plan", CORPUS / "nvidia__DeepSeek-V4-Flash-NVFP4", "--target", "sm_100"]),
        (2, ["plan", missing]),
        (2, ["plan", gptoss, "--target", "sm_75"]),
        (2, ["check", missing]),
        (2, ["check"]),
        (2, ["verify", missing]),
        (2, ["bench", "--checkpoint", missing]),
        (2, ["bench"]),
        (2, ["convert", missing, tmp_path / "out"]),
        (2, ["doctor", missing]),
        (2, ["synth", "no-such-layout", tmp_path / "s"]),
        (2, ["no-such-command"]),
        (2, []),
        (0, ["--help"]),
    ]
    for expected, argv in cases:
        r = fp4moe(*argv)
        assert r.returncode == expected, (argv, r.returncode, r.stderr[-500:])


def test_check_error_finding_exits_1(tmp_path):
    """A check that ran and found an error: exit 1, normal JSON (not an error object)."""
    assert fp4moe("synth", "modelopt-nvfp4", tmp_path / "ckpt").returncode == 0
    idx = tmp_path / "ckpt" / "model.safetensors.index.json"
    shards = sorted((tmp_path / "ckpt").glob("*.safetensors"))
    # Overwrite one weight_scale_2 (an F32 scalar) with NaN: an error finding of check.
    import struct
    for shard in shards:
        raw = bytearray(shard.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        for name, t in header.items():
            if name.endswith("weight_scale_2") and t["dtype"] == "F32":
                begin = 8 + n + t["data_offsets"][0]
                raw[begin:begin + 4] = struct.pack("<f", float("nan"))
                shard.write_bytes(bytes(raw))
                r = fp4moe("check", tmp_path / "ckpt", "--json")
                assert r.returncode == 1, r.stderr
                j = json.loads(r.stdout)
                assert "error" not in j or not isinstance(j["error"], dict)
                assert j.get("schema_version") == 1
                return
    pytest.fail(f"no F32 weight_scale_2 in {shards} ({idx.exists()})")

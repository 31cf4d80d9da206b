#!/usr/bin/env python3
"""Generates tests/data/adversarial: hostile safetensors files and checkpoint directories.

Each case is a small mutation of a valid file, built byte by byte so that the exact hostile bytes
are under control (no JSON library normalises them away). expected.json lists, per case, a
substring of the reason the reader must give and the tensor it must name (or null). Valid controls
are listed too: a reader that rejects everything must fail the tests.

Usage: make_adversarial.py [OUT_DIR]   (default: tests/data/adversarial next to this script)
Deterministic: the same bytes on every run (a pytest checks the committed folder is up to date).
"""
import json
import os
import shutil
import struct
import sys

NEST = 50_000  # nesting depth of the bombs: far beyond any recursion limit a parser may have


def image(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A file: u64 little-endian header length (real or forged), header, data."""
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def tensor(name: str, dtype: str, shape, begin: int, end: int) -> str:
    return (f'"{name}":{{"dtype":"{dtype}","shape":{json.dumps(shape)},'
            f'"data_offsets":[{begin},{end}]}}')


def obj(*entries: str) -> bytes:
    return ("{" + ",".join(entries) + "}").encode()


def f32(name, begin, count=2):
    return tensor(name, "F32", [count], begin, begin + 4 * count)


# Every dtype of the spec once, with its byte size for a shape of [4] elements.
ALL_DTYPES = [("BOOL", 4), ("U8", 4), ("I8", 4), ("F8_E5M2", 4), ("F8_E4M3", 4), ("F8_E8M0", 4),
              ("I16", 8), ("U16", 8), ("F16", 8), ("BF16", 8), ("I32", 16), ("U32", 16),
              ("F32", 16), ("F64", 32), ("I64", 32), ("U64", 32), ("C64", 32), ("F4", 2),
              ("F6_E2M3", 3), ("F6_E3M2", 3)]


def valid_files():
    entries, offset = [], 0
    for dtype, size in ALL_DTYPES:
        entries.append(tensor(f"t.{dtype.lower()}", dtype, [4], offset, offset + size))
        offset += size
    all_dtypes = image(obj('"__metadata__":{"format":"pt","note":"every dtype"}', *entries),
                       bytes(range(offset)))
    # Scalar, zero-size tensors (including two at one offset), escaped names, padding spaces.
    edge_header = obj(tensor("scalar", "F32", [], 0, 4), tensor("empty", "BF16", [0, 7], 4, 4),
                      tensor("empty2", "F4", [3, 0], 4, 4), tensor("quo\\\"te\\u00e9\\ud83d\\ude00",
                                                                    "U8", [2, 2], 4, 8))
    edge_header += b" " * ((8 - (8 + len(edge_header)) % 8) % 8)
    edge = image(edge_header, b"\x00\x00\x80\x3f" + b"abcd")
    return {
        "valid_all_dtypes.safetensors": all_dtypes,
        "valid_edge_cases.safetensors": edge,
        "valid_empty.safetensors": image(b"{}"),
    }


def hostile_files():
    """name -> (bytes, reason substring, tensor named or None)."""
    two = obj(f32("a", 0), f32("b", 8))
    deep = "[" * NEST + "]" * NEST
    return {
        "file_too_short.safetensors": (b"\x08\x00\x00\x00\x00", "too short for the 8-byte", None),
        "header_too_large.safetensors": (image(two, bytes(16), length=100_000_001),
                                         "exceeds the cap", None),
        "header_past_eof.safetensors": (image(two, bytes(16), length=1000),
                                        "runs past the end of the file", None),
        "header_empty.safetensors": (image(b""), "must start with '{'", None),
        "data_truncated.safetensors": (image(two, bytes(12)), "shorter than its header claims", "b"),
        "overlap.safetensors": (image(obj(f32("a", 0), f32("b", 4)), bytes(12)), "overlap", "b"),
        "hole.safetensors": (image(obj(f32("a", 0), f32("b", 12)), bytes(20)), "hole of 4 bytes",
                             "b"),
        "trailing_data.safetensors": (image(obj(f32("a", 0)), bytes(12)),
                                      "trailing bytes not covered", None),
        "duplicate_tensor.safetensors": (image(obj(f32("a", 0), f32("a", 8)), bytes(16)),
                                         "duplicate tensor name", "a"),
        "duplicate_metadata.safetensors": (
            image(obj('"__metadata__":{}', f32("a", 0), '"__metadata__":{}'), bytes(8)),
            "duplicate key '__metadata__'", None),
        "duplicate_metadata_key.safetensors": (
            image(obj('"__metadata__":{"k":"1","k":"2"}', f32("a", 0)), bytes(8)),
            "duplicate key in '__metadata__'", None),
        "duplicate_field.safetensors": (
            image(b'{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                  bytes(8)), "duplicate field 'dtype'", "a"),
        "unknown_dtype.safetensors": (image(obj(tensor("a", "F7", [2], 0, 8)), bytes(8)),
                                      "unknown dtype 'F7'", "a"),
        "lowercase_dtype.safetensors": (image(obj(tensor("a", "f32", [2], 0, 8)), bytes(8)),
                                        "unknown dtype 'f32'", "a"),
        "shape_overflow.safetensors": (
            image(obj(tensor("a", "U8", [2**32, 2**32, 16], 0, 8)), bytes(8)),
            "element count of the shape overflows", "a"),
        "byte_size_overflow.safetensors": (image(obj(tensor("a", "F32", [2**62], 0, 8)), bytes(8)),
                                           "overflows 64 bits", "a"),
        "dimension_too_large.safetensors": (image(obj(tensor("a", "U8", [2**63], 0, 8)), bytes(8)),
                                            "is too large", "a"),
        "offset_too_large.safetensors": (
            image(b'{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,18446744073709551616]}}',
                  bytes(8)), "is too large", "a"),
        "negative_offset.safetensors": (image(obj(tensor("a", "F32", [2], -8, 0)), bytes(8)),
                                        "negative number", "a"),
        "negative_dimension.safetensors": (image(obj(tensor("a", "F32", [-2], 0, 8)), bytes(8)),
                                           "negative number", "a"),
        "fractional_offset.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}', bytes(8)),
            "not an integer", "a"),
        "exponent_offset.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e0]}}', bytes(8)),
            "not an integer", "a"),
        "fractional_dimension.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}', bytes(8)),
            "not an integer", "a"),
        "leading_zero.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,08]}}', bytes(8)),
            "leading zero", None),
        "string_offset.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}}', bytes(8)),
            "expected a non-negative integer", "a"),
        "odd_f4.safetensors": (image(obj(tensor("a", "F4", [3], 0, 2)), bytes(2)), "mid-byte", "a"),
        "odd_f4_2d.safetensors": (image(obj(tensor("a", "F4", [3, 5], 0, 8)), bytes(8)),
                                  "mid-byte", "a"),
        "f6_mid_byte.safetensors": (image(obj(tensor("a", "F6_E2M3", [3], 0, 3)), bytes(3)),
                                    "mid-byte", "a"),
        "span_mismatch.safetensors": (image(obj(tensor("a", "F32", [2], 0, 4)), bytes(4)),
                                      "bytes but F32 shape needs 8", "a"),
        "begin_after_end.safetensors": (image(obj(tensor("a", "F32", [0], 8, 0)), bytes(8)),
                                        "is after end", "a"),
        "offsets_three.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}', bytes(8)),
            "exactly [begin, end]", "a"),
        "missing_offsets.safetensors": (image(b'{"a":{"dtype":"F32","shape":[2]}}', bytes(8)),
                                        "missing field 'data_offsets'", "a"),
        "unknown_field.safetensors": (
            image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', bytes(8)),
            "unknown field 'x'", "a"),
        "entry_not_object.safetensors": (image(b'{"a":"F32"}'), "must be an object", "a"),
        "nesting_bomb_entry.safetensors": (image(('{"a":' + deep + "}").encode()),
                                           "nested value", "a"),
        "nesting_bomb_shape.safetensors": (
            image(('{"a":{"dtype":"F32","shape":' + deep + ',"data_offsets":[0,0]}}').encode()),
            "nested value", "a"),
        "nesting_bomb_metadata.safetensors": (
            image(('{"__metadata__":{"k":' + deep + "}}").encode()), "must be a string", None),
        "nesting_bomb_top.safetensors": (image(deep.encode()), "must start with '{'", None),
        "invalid_utf8.safetensors": (image(b'{"a\xff":{"dtype":"U8","shape":[0],'
                                           b'"data_offsets":[0,0]}}'), "not valid UTF-8", None),
        "overlong_utf8.safetensors": (image(b'{"a\xc0\xaf":{"dtype":"U8","shape":[0],'
                                            b'"data_offsets":[0,0]}}'), "not valid UTF-8", None),
        "surrogate_utf8.safetensors": (image(b'{"a\xed\xa0\x80":{"dtype":"U8","shape":[0],'
                                             b'"data_offsets":[0,0]}}'), "not valid UTF-8", None),
        "lone_surrogate_escape.safetensors": (image(b'{"a\\ud800":{"dtype":"U8","shape":[0],'
                                                    b'"data_offsets":[0,0]}}'),
                                              "unpaired UTF-16 surrogate", None),
        "control_char_name.safetensors": (image(b'{"a\x01":{"dtype":"U8","shape":[0],'
                                                b'"data_offsets":[0,0]}}'),
                                          "control character", None),
        "empty_name.safetensors": (image(obj(tensor("", "U8", [0], 0, 0))), "empty tensor name",
                                   ""),
        "not_an_object.safetensors": (image(b'[{"a":1}]'), "must start with '{'", None),
        "leading_space.safetensors": (image(b" {}"), "must start with '{'", None),
        "trailing_garbage.safetensors": (image(b"{} x"), "unexpected bytes after the header", None),
        "two_objects.safetensors": (image(b"{}{}"), "unexpected bytes after the header", None),
        "truncated_json.safetensors": (image(b'{"a":{"dtype"'), "end of header", None),
        "unterminated_string.safetensors": (image(b'{"a'), "unterminated string", None),
        "metadata_not_string.safetensors": (image(b'{"__metadata__":{"k":1}}'),
                                            "must be a string", None),
        "metadata_null.safetensors": (image(b'{"__metadata__":null}'),
                                      "'__metadata__' must be an object", None),
    }


def shard(*entries_and_sizes) -> bytes:
    entries, offset = [], 0
    for name in entries_and_sizes:
        entries.append(f32(name, offset))
        offset += 8
    return image(obj(*entries), bytes(range(offset)))


def hostile_dirs():
    """name -> ({relative path: bytes}, reason substring, tensor named or None)."""
    good_shard = shard("x", "y")
    index = lambda wm: json.dumps({"metadata": {"total_size": 16}, "weight_map": wm}).encode()
    nested = ("[" * 1000 + "]" * 1000).encode()
    return {
        "index_dotdot": ({"model.safetensors.index.json": index({"x": "../outside.safetensors"})},
                         "'..' leaves the checkpoint directory", "x"),
        "index_absolute": ({"model.safetensors.index.json": index({"x": "/etc/passwd"})},
                           "absolute path leaves the checkpoint directory", "x"),
        "index_missing_shard": ({"model-00001-of-00002.safetensors": good_shard,
                                 "model.safetensors.index.json":
                                     index({"x": "model-00001-of-00002.safetensors",
                                            "y": "model-00002-of-00002.safetensors"})},
                                "missing shard", "y"),
        "index_wrong_shard": ({"a.safetensors": shard("x"), "b.safetensors": shard("y"),
                               "model.safetensors.index.json":
                                   index({"x": "a.safetensors", "y": "a.safetensors"})},
                              "which does not contain it", "y"),
        "index_unlisted_tensor": ({"a.safetensors": good_shard,
                                   "model.safetensors.index.json": index({"x": "a.safetensors"})},
                                  "missing from the weight_map", "y"),
        "index_not_string": ({"a.safetensors": good_shard,
                              "model.safetensors.index.json": index({"x": 1, "y": "a.safetensors"})},
                             "is not a string", "x"),
        "index_no_weight_map": ({"a.safetensors": good_shard,
                                 "model.safetensors.index.json": b'{"metadata":{}}'},
                                "missing 'weight_map'", None),
        "index_bad_shard": ({"a.safetensors": image(b"{} x"),
                             "model.safetensors.index.json": index({"q": "a.safetensors"})},
                            "unexpected bytes after the header", None),
        "duplicate_across_shards": ({"a.safetensors": good_shard, "b.safetensors": shard("y")},
                                    "is in two shards", "y"),
        "config_invalid_json": ({"model.safetensors": good_shard, "config.json": b'{"a":'},
                                "config.json: invalid JSON", None),
        "config_nesting_bomb": ({"model.safetensors": good_shard, "config.json": nested},
                                "config.json: JSON nesting deeper than", None),
        "quant_config_invalid_utf8": ({"model.safetensors": good_shard,
                                       "hf_quant_config.json": b'{"a":"\xff"}'},
                                      "hf_quant_config.json: invalid JSON", None),
        "no_shards": ({"config.json": b"{}"}, "no *.safetensors files", None),
    }


def valid_dirs():
    return {
        "valid_sharded": {"model-00001-of-00002.safetensors": shard("x"),
                          "model-00002-of-00002.safetensors": shard("y", "z"),
                          "model.safetensors.index.json": json.dumps(
                              {"metadata": {"total_size": 24},
                               "weight_map": {"x": "model-00001-of-00002.safetensors",
                                              "y": "model-00002-of-00002.safetensors",
                                              "z": "model-00002-of-00002.safetensors"}}).encode(),
                          "config.json": b'{"model_type":"test","quantization_config":{}}',
                          "tokenizer.json": b"{}"},
        "valid_unindexed": {"a.safetensors": shard("x"), "b.safetensors": shard("y")},
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.normpath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(here, "..", "data", "adversarial"))
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "files"))
    os.makedirs(os.path.join(out, "dirs"))
    manifest = {"files": {}, "dirs": {}, "valid_files": [], "valid_dirs": []}
    for name, data in valid_files().items():
        with open(os.path.join(out, "files", name), "wb") as f:
            f.write(data)
        manifest["valid_files"].append(name)
    for name, (data, reason, tensor_name) in hostile_files().items():
        with open(os.path.join(out, "files", name), "wb") as f:
            f.write(data)
        manifest["files"][name] = {"reason": reason, "tensor": tensor_name}
    for kind, cases in (("dirs", hostile_dirs()), ("valid_dirs", valid_dirs())):
        for name, case in cases.items():
            files = case if kind == "valid_dirs" else case[0]
            os.makedirs(os.path.join(out, "dirs", name))
            for rel, data in files.items():
                with open(os.path.join(out, "dirs", name, rel), "wb") as f:
                    f.write(data)
            if kind == "dirs":
                manifest["dirs"][name] = {"reason": case[1], "tensor": case[2]}
            else:
                manifest["valid_dirs"].append(name)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{out}: {len(manifest['files'])} hostile files, {len(manifest['dirs'])} hostile "
          f"directories, {len(manifest['valid_files'])} + {len(manifest['valid_dirs'])} controls")


if __name__ == "__main__":
    main()

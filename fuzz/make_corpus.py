#!/usr/bin/env python3
"""Writes the fuzz seed corpus (fuzz/corpus/<target>/) and dictionaries (fuzz/dict/<target>.dict) from test/data.

Standard library only; run from anywhere: python3 fuzz/make_corpus.py. The output is committed, so run it again
only when test/data or the parsers' field names change. Seeds stay small (the whole corpus is well under 1 MB):
safetensors seeds are a few tensors cut out of the test checkpoints (header rewritten with new offsets, padded
with spaces to 8 bytes as the reference writer does), each preceded by the 2 bytes of FP8 block size that
fuzz/safetensors.cpp reads first.

fuzz_checkpoint's seeds and dictionary (fuzz/corpus/checkpoint, fuzz/dict/checkpoint.dict) are not written here:
its inputs are programs of edits whose opcodes and tables live in fuzz/checkpoint.cpp, so the target writes them
itself from symbolic programs, which stay in step with its decoder (see the top of fuzz/checkpoint.cpp):
    MOONMOE_FUZZ_WRITE_SEEDS=fuzz/corpus/checkpoint MOONMOE_FUZZ_WRITE_DICT=fuzz/dict/checkpoint.dict \
        build-fuzz/fuzz/fuzz_checkpoint -runs=0
"""
import json
import re
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "test" / "data"
FUZZ = ROOT / "fuzz"

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", None)
    tensors = {name: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
               for name, e in header.items()}
    return metadata, tensors


def write_safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes), stored in this order."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def block_prefix(b0, b1):
    """The 2 bytes fuzz/safetensors.cpp reads as the FP8 block size (block_dim there): sizes below 224 as is."""
    assert 0 <= b0 < 0xE0 and 0 <= b1 < 0xE0
    return bytes([b0, b1])


BLOCK_INT64_MAX = bytes([0xF0, 0xF0])  # block_dim(0xF0) == INT64_MAX


def smallest(tensors, count, keep=lambda name: True):
    names = sorted((len(t[2]), name) for name, t in tensors.items() if keep(name))
    return [name for _, name in names[:count]]


def pick(tensors, names):
    return [(name, *tensors[name]) for name in names]


def safetensors_seeds():
    seeds = {}
    meta, t = read_safetensors(DATA / "tiny_k2" / "model.safetensors")
    seeds["k2_f32_small"] = block_prefix(128, 128) + write_safetensors(pick(t, smallest(t, 4)), meta)
    meta, t = read_safetensors(DATA / "tiny_k2_bf16" / "model.safetensors")
    seeds["k2_bf16_small"] = block_prefix(128, 128) + write_safetensors(pick(t, smallest(t, 4)), meta)

    # FP8 weights with their scale_inv companions, in the checkpoint's own 16 x 16 blocks.
    meta, t = read_safetensors(DATA / "tiny_k2_fp8" / "model.safetensors")
    block = json.loads((DATA / "tiny_k2_fp8" / "config.json").read_text())["quantization_config"]["weight_block_size"]
    fp8 = [name for name in sorted(t) if t[name][0] == "F8_E4M3"]
    tall = min((n for n in fp8 if t[n][1][0] > t[n][1][1]), key=lambda n: len(t[n][2]))
    wide = min((n for n in fp8 if t[n][1][0] < t[n][1][1]), key=lambda n: len(t[n][2]))
    norm = smallest(t, 1, lambda n: t[n][0] == "F32" and not n.endswith("_scale_inv"))
    for label, weight in (("tall", tall), ("wide", wide)):
        names = [weight, weight + "_scale_inv"] + norm
        seeds[f"k2_fp8_{label}"] = block_prefix(*block) + write_safetensors(pick(t, names), meta)
    # The same weight with a block size at INT64_MAX: ceil(rows / block) must not overflow.
    seeds["k2_fp8_huge_block"] = BLOCK_INT64_MAX + write_safetensors(pick(t, [tall, tall + "_scale_inv"]), meta)

    meta, t = read_safetensors(DATA / "optim" / "newton_schulz.safetensors")
    seeds["f64_with_metadata"] = block_prefix(128, 128) + write_safetensors(pick(t, smallest(t, 3)), meta)
    meta, t = read_safetensors(DATA / "optim" / "qk_clip.safetensors")
    ints = [n for n in sorted(t) if t[n][0] == "I64"]
    seeds["i64"] = block_prefix(128, 128) + write_safetensors(pick(t, ints + smallest(t, 1)), {"format": "pt"})

    # Every dtype once, an E5M2 weight in 2 x 2 blocks, and the edge shapes: a scalar, zero-size tensors.
    every = [(f"t.{d.lower()}", d, [2], bytes(range(1, 2 * s + 1))) for d, s in DTYPE_SIZE.items()]
    seeds["every_dtype"] = block_prefix(1, 1) + write_safetensors(every)
    e5m2 = [("w", "F8_E5M2", [3, 5], bytes(range(0x30, 0x3F))),
             ("w_scale_inv", "F32", [2, 3], struct.pack("<6f", 1, 2, 0.5, 0.25, 4, 8))]
    seeds["fp8_e5m2_blocks"] = block_prefix(2, 2) + write_safetensors(e5m2)
    edges = [("scalar", "F32", [], struct.pack("<f", 1.5)), ("empty", "F32", [0], b""),
             ("empty2d", "BF16", [2, 0], b""), ("q", "F8_E4M3", [0, 4], b""), ("q_scale_inv", "F32", [0, 1], b"")]
    seeds["edge_shapes"] = block_prefix(128, 128) + write_safetensors(edges)
    seeds["metadata_only"] = block_prefix(128, 128) + write_safetensors([], {"format": "pt"})
    return seeds


def raw_string(source, variable):
    """The text of `const char* const <variable> = R"(...)";` in a C++ source."""
    m = re.search(re.escape(variable) + r'\s*=\s*R"\((.*?)\)"', source, re.S)
    if not m:
        raise SystemExit(f"make_corpus.py: no raw string {variable} in test/unit/io_hf_config.cpp")
    return m.group(1)


def hf_config_seeds():
    seeds, seen = {}, set()
    for config in sorted(DATA.glob("*/config.json")):
        text = config.read_text()
        if text not in seen:
            seen.add(text)
            seeds[config.parent.name] = text
    source = (ROOT / "test" / "unit" / "io_hf_config.cpp").read_text()
    seeds["kimi_k2_instruct"] = raw_string(source, "kimi_k2_config")
    seeds["deepseek_v3"] = raw_string(source, "deepseek_v3_config")

    # transformers 5 layout: rope_theta and rope_scaling folded into rope_parameters.
    k2 = json.loads(seeds["kimi_k2_instruct"])
    rope = dict(k2.pop("rope_scaling"), rope_theta=k2.pop("rope_theta"))
    rope["rope_type"] = rope.pop("type", "yarn")
    k2["rope_parameters"] = rope
    seeds["kimi_k2_v5_layout"] = json.dumps(k2, indent=2)

    tiny = json.loads((DATA / "tiny_k2" / "config.json").read_text())
    tiny.update(q_lora_rank=None, eos_token_id=[1, 2], dtype=tiny.pop("torch_dtype", "float32"))
    seeds["tiny_k2_variants"] = json.dumps(tiny, indent=2)
    return {name: text.encode() for name, text in seeds.items()}


def index_seeds():
    text = (DATA / "tiny_v3_sharded" / "model.safetensors.index.json").read_text()
    index = json.loads(text)
    dotted = dict(index, weight_map={name: ("./" if i % 2 == 0 else "") + file
                                     for i, (name, file) in enumerate(sorted(index["weight_map"].items()))})
    minimal = {"metadata": {"total_size": 4}, "weight_map": {"model.norm.weight": "model.safetensors"}}
    return {"tiny_v3_sharded": text.encode(), "dot_slash": json.dumps(dotted, indent=2).encode(),
            "minimal": json.dumps(minimal).encode()}


def dictionary(strings):
    """A libFuzzer / AFL dictionary: each string as a JSON string token and bare."""
    tokens = []
    for s in strings:
        tokens += [json.dumps(s).encode(), s.encode()]
    lines, seen = [], set()
    for token in tokens:
        if token and token not in seen:
            seen.add(token)
            lines.append('"' + "".join(chr(c) if 0x20 <= c < 0x7F and c not in b'"\\' else f"\\x{c:02x}"
                                       for c in token) + '"')
    return "\n".join(lines) + "\n"


JSON_TOKENS = ["{", "}", "[", "]", ":", ",", "null", "true", "false", "-1", "0", "1e308", "1e999", "-0.0",
               "9223372036854775807", "9223372036854775808", "18446744073709551616", "\\u0000", "\\ud800"]


def dictionaries():
    hf = (ROOT / "include" / "moonmoe" / "io" / "hf_config.hpp").read_text()
    fields = sorted(set(re.findall(r'"([a-z][a-z0-9_]*)"', hf)) | {"DeepseekV3ForCausalLM", "float32", "bfloat16"})
    dtypes = list(DTYPE_SIZE)
    safetensors = ["dtype", "shape", "data_offsets", "__metadata__", "_scale_inv", "format", "pt"] + dtypes
    index = ["weight_map", "metadata", "total_size", "./", "../", "/", ".", "..", "\\",
             "model-00001-of-00003.safetensors", "model.safetensors"]
    return {"safetensors": dictionary(safetensors + JSON_TOKENS),
            "hf_config": dictionary(fields + JSON_TOKENS),
            "index": dictionary(index + JSON_TOKENS)}


def main():
    corpora = {"safetensors": safetensors_seeds(), "hf_config": hf_config_seeds(), "index": index_seeds()}
    total = 0
    for target, seeds in corpora.items():
        out = FUZZ / "corpus" / target
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name, data in seeds.items():
            (out / name).write_bytes(data)
            total += len(data)
        print(f"fuzz/corpus/{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")
    (FUZZ / "dict").mkdir(exist_ok=True)
    for target, text in dictionaries().items():
        (FUZZ / "dict" / f"{target}.dict").write_text(text)
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()

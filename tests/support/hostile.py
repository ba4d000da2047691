"""Hostile files, built by scripts: zips whose headers lie, decompression bombs in .npz and
parquet, pickles that expand or contain themselves, tensors whose storage or strides lie,
architectures of absurd depth or size, and models that compute or allocate far too much."""
import functools
import io
import json
import struct
import zipfile
import zlib
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import attribution as at


# ------------------------------------------------------------------ building blocks

def raw_zip(entries: list[tuple[str | bytes, int, bytes, int, int]], *,
            claimed: Optional[int] = None, flags: int = 0) -> bytes:
    """A zip of (name, method, packed bytes, crc, declared size) entries, written by hand so
    that a header may lie: `claimed` is the entry count its end record states (default: the
    true count), `flags` every entry's general-purpose bits (0x800: names are UTF-8)."""
    out, central = io.BytesIO(), []
    for name, method, packed, crc, size in entries:
        offset = out.tell()
        encoded = name if isinstance(name, bytes) else name.encode()
        out.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, flags, method, 0, 0x21, crc,
                              len(packed), size, len(encoded), 0) + encoded + packed)
        central.append(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, flags, method, 0,
                                   0x21, crc, len(packed), size, len(encoded), 0, 0, 0, 0, 0,
                                   offset) + encoded)
    start, directory = out.tell(), b"".join(central)
    out.write(directory)
    count = len(entries) if claimed is None else claimed
    if count > 0xFFFF:  # the zip64 end records carry the count
        end64 = out.tell()
        out.write(struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count,
                              len(directory), start))
        out.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, end64, 1))
        count = 0xFFFF
    out.write(struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, count, count, len(directory),
                          start, 0))
    return out.getvalue()


def deflated_zeros(prefix: bytes, zeros: int) -> tuple[bytes, int]:
    """(deflate stream, crc) of `prefix` + `zeros` zero bytes, made in well under a second:
    after a full flush the compressor restarts, so every 16 MiB block compresses alike."""
    block = 1 << 24
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    segment = compressor.compress(bytes(block)) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = compressor.compress(bytes(zeros % block)) + compressor.flush()
    crc, zero_block = zlib.crc32(prefix), bytes(block)
    for _ in range(zeros // block):
        crc = zlib.crc32(zero_block, crc)
    crc = zlib.crc32(bytes(zeros % block), crc)
    return head + segment * (zeros // block - 1) + segment + tail, crc


def npy_header(dtype: str, shape: tuple) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue()


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


TINY = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
TINY_ARCHITECTURE = {"kind": "mlp", "input_shape": [4], "hidden": [3], "n_classes": 2}


# ------------------------------------------------------------------ the hostile files

def npz_bomb() -> bytes:
    """2.4 GB of float64 zeros in a 2.4 MB .npz (an honest header: the sizes are true)."""
    count = 300_000_000
    header = npy_header("<f8", (count,))
    packed, crc = deflated_zeros(header, count * 8)
    return raw_zip([("inputs.npy", 8, packed, crc, len(header) + count * 8)])


def npz_bomb_in_parts() -> bytes:
    """Three entries of 0.8 GB, each under the budget, 2.4 GB together."""
    count = 100_000_000
    header = npy_header("<f8", (count,))
    packed, crc = deflated_zeros(header, count * 8)
    return raw_zip([(f"{name}.npy", 8, packed, crc, len(header) + count * 8)
                    for name in ("inputs", "labels", "clusters")])


def lying_zip_header() -> bytes:
    """An entry declaring 2 x 2 float64 values whose stream inflates to 1 GB."""
    header = npy_header("<f8", (2, 2))
    packed, _ = deflated_zeros(header, 10 ** 9)
    declared = header + bytes(32)
    return raw_zip([("inputs.npy", 8, packed, zlib.crc32(declared), len(declared))])


def many_zip_entries(claimed: Optional[int] = None) -> bytes:
    """150,000 empty entries: a directory that would take ~100 MB of Python objects; its end
    record states `claimed` entries (default: the true count)."""
    return raw_zip([(f"{index}.npy", 0, b"", 0, 0) for index in range(150_000)],
                   claimed=claimed)


def zip_with_names(*names: str | bytes, flags: int = 0) -> bytes:
    """A zip of one small .npy array under each of `names`."""
    array = io.BytesIO()
    np.save(array, np.zeros((2, 2), np.float32))
    content = array.getvalue()
    return raw_zip([(name, 0, content, zlib.crc32(content), len(content)) for name in names],
                   flags=flags)


def parquet_number_bomb() -> bytes:
    """200,000 rows x 1,300 columns of zeros: 2.1 GB decoded from a few MB (one shared
    buffer, written with dictionary and run-length encoding)."""
    zeros = pa.array(np.zeros(200_000))
    return parquet(pa.table({f"f{index}": zeros for index in range(1_300)}))


def parquet_text_bomb() -> bytes:
    """200,000 rows of one 20 kB string: 4 GB of text behind a one-entry dictionary."""
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(200_000, np.int32)),
                                            pa.array(["x" * 20_000]))
    return parquet(pa.table({"f0": pa.array(np.zeros(200_000)), "cluster": column}))


def parquet_row_groups() -> bytes:
    """12,000 one-row row groups: a footer whose parsing grows with the file."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"f0": np.zeros(12_000), "label": np.zeros(12_000, np.int64)}),
                   buffer, row_group_size=1)
    return buffer.getvalue()


def parquet_nested() -> bytes:
    """A list column: one row may hold any number of values."""
    values = pa.array([np.zeros(1000)] * 10, type=pa.list_(pa.float64()))
    return parquet(pa.table({"f0": values, "label": np.zeros(10, np.int64)}))


def long_cluster_ids() -> bytes:
    """200,000 rows of 100 short cluster ids and one of 100 kB: 80 GB as a text array."""
    clusters = np.array(["a"] * 199_999 + ["x" * 100_000], dtype=object)
    return parquet(pa.table({"f0": pa.array(np.zeros(200_000)), "cluster": clusters}))


def pickle_laughs() -> bytes:
    """10 shared references per level, 9 levels: 1e9 values behind a 1.5 kB .pt."""
    value = [0.0] * 10
    for _ in range(8):
        value = [value] * 10
    return saved({"inputs": value})


def pickle_cycle() -> bytes:
    value: list = [[0.0, 1.0]]
    value.append(value)
    return saved({"inputs": value})


@functools.cache  # two cases (a .pt of data and a state dict) read the same 5 MB
def many_tensors() -> bytes:
    """60,000 views of one storage: a 5 MB pickle that PyTorch's safe unpickler reads for
    ~15 s (200,000 views: 42 s)."""
    base = torch.zeros(4)
    return saved({f"t{index}": base[:2] for index in range(60_000)})


def stride_zero_tensor(bare: bool = False) -> bytes:
    """One float stored, viewed as 1e6 x 1e6 (stride 0): 4 TB once converted; saved alone
    (`bare`) or in a dict."""
    tensor = torch.zeros(1).expand(10 ** 6, 10 ** 6)
    return saved(tensor if bare else {"inputs": tensor})


def storage_declared_larger() -> bytes:
    """A torch.save zip whose pickle declares a 2**31-element storage over a 49 kB record."""
    source = zipfile.ZipFile(io.BytesIO(saved({"inputs": torch.zeros(12345, 1)})))
    small, large = b"M" + (12345).to_bytes(2, "little"), b"J" + (2 ** 31 - 1).to_bytes(4, "little")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name in source.namelist():
            content = source.read(name)
            archive.writestr(name, content.replace(small, large) if name.endswith("data.pkl")
                             else content)
    return out.getvalue()


def wide_csv() -> bytes:
    """1e6 columns (14 MB): parsed without a budget, 145 s and then MemoryError."""
    names = ",".join(f"c{index}" for index in range(1_000_000))
    return (names + "\n" + ",".join(["0"] * 1_000_000) + "\n").encode()


def csv_hiding_columns() -> bytes:
    """200,001 columns behind a header whose first cell is quoted across a newline: the
    first line alone reads as one column."""
    names = ",".join(f"c{index}" for index in range(200_000))
    return ('"x\n",' + names + "\n" + ",".join(["0"] * 200_001) + "\n").encode()


def deep_architecture(form: str) -> bytes:
    """21,000 layers in a 63 kB description."""
    if form == "json":
        return json.dumps(dict(TINY_ARCHITECTURE, hidden=[3] * 21_000)).encode()
    return ("kind: mlp\ninput_shape: [4]\nn_classes: 2\nhidden: [" + "3," * 20_999
            + "3]\n").encode()


def yaml_laughs() -> bytes:
    lines = ["kind: mlp", "input_shape: [4]", "n_classes: 2", "a0: &a0 [3, 3, 3, 3, 3, 3, 3, 3]"]
    lines += [f"a{index}: &a{index} [" + ", ".join([f"*a{index - 1}"] * 8) + "]"
              for index in range(1, 10)]
    return ("\n".join(lines) + "\nhidden: *a9\n").encode()


def huge_parameter_count() -> bytes:
    return json.dumps(dict(TINY_ARCHITECTURE, input_shape=[65536],
                           hidden=[65536] * 300)).encode()


def exotic_tensor(kind: str) -> torch.Tensor:
    values = torch.ones(4, 4)
    if kind == "sparse":
        return values.to_sparse()
    if kind == "quantized":
        return torch.quantize_per_tensor(values, 0.1, 0, torch.quint8)
    if kind == "meta":
        return torch.ones(4, 4, device="meta")
    if kind == "shadowed":  # attributes named like methods, set back by the unpickler
        values.numpy, values.detach = 1, "not callable"
        return values
    return values.to(torch.complex64)


def state_dict_with(kind: str) -> bytes:
    state = dict(TINY.state_dict())
    state["0.weight"] = exotic_tensor(kind)[:3, :4] if kind != "sparse" else \
        torch.ones(3, 4).to_sparse()
    if kind == "shadowed":  # a slice has no attributes: set them on the weight itself
        state["0.weight"] = torch.ones(3, 4)
        state["0.weight"].numpy, state["0.weight"].detach = 1, "not callable"
    return saved(state)


def expanded_state_dict() -> bytes:
    state = dict(TINY.state_dict())
    state["0.weight"] = torch.zeros(1).expand(100_000, 100_000)
    return saved(state)


def conv_bomb() -> tuple[bytes, bytes]:
    """A 3 MB state dict whose architecture convolves a 1024 x 1024 image with 31 x 31
    kernels: ~800 GFLOP for the probe batches of 1 and 3 samples."""
    description = {"kind": "cnn", "input_shape": [1, 1024, 1024], "channels": [16] * 4,
                   "kernel_size": 31, "pool": 2, "hidden": [], "n_classes": 2}
    module = at.parse_architecture(description).build(device="meta")
    state = {key: torch.zeros(value.shape) for key, value in module.state_dict().items()}
    return saved(state), json.dumps(description).encode()


def conv_memory_bomb() -> tuple[bytes, bytes]:
    """A 20 kB state dict whose first convolution outputs 64 maps of 2048 x 2048: 1 GB per
    sample."""
    description = {"kind": "cnn", "input_shape": [1, 2048, 2048], "channels": [64, 1, 1, 1, 1],
                   "kernel_size": 3, "pool": 2, "hidden": [], "n_classes": 2}
    module = at.parse_architecture(description).build(device="meta")
    state = {key: torch.zeros(value.shape) for key, value in module.state_dict().items()}
    return saved(state), json.dumps(description).encode()


class BatchSquareBomb(nn.Module):
    """Cheap for batches of 1 and 3 (a 3072 x 3072 product), ruinous at the engine's batch
    size: 256 samples make a 262,144 x 262,144 product (275 GB)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        big = x.new_ones(x.shape[0] * 1024, 64)
        return self.fc(x) + (big @ big.t()).sum() * 0.0


class CondBomb(nn.Module):
    """A branch on the data (torch.cond): zeros take the light branch; a batch that sums
    above 100 takes ten products of 4096 x 4096 matrices (1.4 TFLOP)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        def heavy(x):
            big = x.new_ones(4096, 4096)
            for _ in range(10):
                big = big @ big
            return x + big[:1, :4].sum()

        def light(x):
            return x * 1.0

        return self.fc(torch.cond(x.sum() > 100, heavy, light, (x,)))


class MatmulBomb(nn.Module):
    """A legal aten graph: 20 products of 6000 x 6000 matrices made inside forward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        big = torch.ones(6000, 6000)
        for _ in range(20):
            big = big @ big * 0.0
        return self.fc(x) + big[:1, :2].sum()


class MemoryBomb(nn.Module):
    """Asks for 40 GB inside forward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x) + torch.ones(100_000, 100_000)[:1, :2].sum()


def exported(module: nn.Module) -> bytes:
    program = torch.export.export(module.eval(), (torch.zeros(2, 4),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def rebuilt(data: bytes, edit, compression=zipfile.ZIP_STORED) -> bytes:
    """The archive with `edit(entries)` applied to its {name below the root: bytes}."""
    source = zipfile.ZipFile(io.BytesIO(data))
    root = source.namelist()[0].split("/")[0]
    entries = {name.split("/", 1)[1]: source.read(name) for name in source.namelist()}
    edit(entries)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, content in entries.items():
            archive.writestr(name[1:] if name.startswith("/") else f"{root}/{name}", content)
    return out.getvalue()


def program_edit(change):
    """An edit of models/model.json through `change(program)`."""
    def edit(entries):
        program = json.loads(entries["models/model.json"])
        change(program)
        entries["models/model.json"] = json.dumps(program).encode()
    return edit


def text_model_with(edit) -> bytes:
    """The text demo's save_pretrained folder as an uploaded zip, its tokenizer changed by
    `edit(tokenizer)` (a `tokenizers.Tokenizer`): a tokenizer is a program of regexes and
    rewrites that runs on the data."""
    from tokenizers import Tokenizer

    from attribution.inputs.shipped import DEMO_DIR

    folder = DEMO_DIR / "text_classifier"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    edit(tokenizer)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.iterdir()):
            content = tokenizer.to_str().encode() if path.name == "tokenizer.json" \
                else path.read_bytes()
            archive.writestr(f"model/{path.name}", content)
    return buffer.getvalue()


def catastrophic_regex_tokenizer() -> bytes:
    """A pre-tokenizer whose regex backtracks exponentially: (a|aa)+$ takes about 1.6x longer
    per 'a' before a 'b' (0.04 s at 28, hours at 60)."""
    from tokenizers import Regex, pre_tokenizers

    def edit(tokenizer):
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("(a|aa)+$"), behavior="isolated")
    return text_model_with(edit)


def expanding_normalizer() -> bytes:
    """A normalizer that rewrites every 'e' as ten million characters."""
    from tokenizers import normalizers

    def edit(tokenizer):
        tokenizer.normalizer = normalizers.Replace("e", "x" * 10 ** 7)
    return text_model_with(edit)


def texts(text: str, rows: int) -> bytes:
    """A CSV of `rows` copies of `text` with a label column."""
    return ("text,label\n" + "".join(f"{text},0\n" for _ in range(rows))).encode()


def quoted_overlap_zip(inner: dict[str, bytes], outer_name: str = "model.safetensors") -> bytes:
    """Fifield's overlapping zip: a stored entry `outer_name` whose data quotes the local
    headers and data of the `inner` entries, each listed again in the directory at its
    place inside the outer one, so their bytes are read twice (a zip bomb's construction;
    zipfile reads every entry without complaint)."""
    def local(name: bytes, data: bytes) -> bytes:
        return struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 0, 0, 0x21, zlib.crc32(data),
                           len(data), len(data), len(name), 0) + name + data

    quoted, offsets = b"", []
    outer = outer_name.encode()
    for name, data in inner.items():
        offsets.append(30 + len(outer) + len(quoted))
        quoted += local(name.encode(), data)
    body = local(outer, quoted)
    central = [(outer, quoted, 0)] + [(name.encode(), data, offset) for (name, data), offset
                                      in zip(inner.items(), offsets)]
    directory = b"".join(
        struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, zlib.crc32(data),
                    len(data), len(data), len(name), 0, 0, 0, 0, 0, offset) + name
        for name, data, offset in central)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(central), len(central),
                      len(directory), len(body), 0)
    return body + directory + end


class NonzeroSquare(nn.Module):
    """nonzero(x > 0.5) sizes a [k, k] matrix: k = 0 on the zeros of a first run, +1 GiB a
    batch of 256 on ones."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        k = torch.nonzero(x.flatten() > 0.5).shape[0]
        return self.fc(x) + x.new_ones(k, k).sum() * 0.0


def long_class_name() -> bytes:
    """A 78 kB .npz whose class names hold one name of 40 MB."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, inputs=np.zeros((10, 64), np.float32),
                        labels=np.arange(10) % 2, class_names=np.array([b"a" * 40_000_000, b"b"]))
    return buffer.getvalue()


def many_clusters() -> bytes:
    """200,000 rows in 10,000 clusters of 20 (diagnosed one by one, it hung past 90 s)."""
    return npz(inputs=np.zeros((200_000, 4), np.float32),
               clusters=np.arange(200_000) % 10_000)


def long_cluster_names_csv() -> bytes:
    """200,000 rows whose cluster ids are 50 names of 1,000 characters (+2.6 GiB as text):
    row i names cluster i % 50, written as pandas' to_csv writes them (~10x faster)."""
    rows = b"".join(f"0.0,0,{'c' * 995}{index}\n".encode() for index in range(50))
    return b"f0,label,cluster\n" + rows * (200_000 // 50)

"""Safetensors reading and writing, and the release formats' dequantisation
(spec §3.2, §3.4, §8), with numpy only."""
import json
import struct

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _e4m3_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = _e4m3_table()


def _bf16(raw):
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)


def read(path):
    """Returns {name: (dtype, shape, raw bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], v["shape"], data[a:b])
    return out


def read_dir(d):
    """All tensors of a checkpoint directory (sharded or not)."""
    import glob
    import os
    t = {}
    for p in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        t.update(read(p))
    return t


def plain(dt, shape, raw):
    """A non-quantised tensor as float32 (or int64)."""
    if dt == "BF16":
        return _bf16(raw).reshape(shape)
    if dt == "F32":
        return np.frombuffer(raw, np.float32).reshape(shape).copy()
    if dt == "I64":
        return np.frombuffer(raw, np.int64).reshape(shape).copy()
    raise ValueError(f"dtype {dt} is not a plain tensor")


def e8m0(raw, shape):
    return np.exp2(np.frombuffer(raw, np.uint8).astype(np.float32) - 127).reshape(shape)


def linear(t, name):
    """The fp32 [out, in] matrix of linear `name` (FP8 block, MXFP4, BF16 or F32)."""
    dt, shape, raw = t[name + ".weight"]
    if dt == "F8_E4M3":
        w = E4M3[np.frombuffer(raw, np.uint8)].reshape(shape)
        sdt, sshape, sraw = t[name + ".scale"]
        s = e8m0(sraw, sshape)
        s = np.repeat(np.repeat(s, 128, 0), 128, 1)[: shape[0], : shape[1]]
        return w * s
    if dt == "I8":  # packed e2m1, low nibble first, per-32 e8m0 scales
        b = np.frombuffer(raw, np.uint8).reshape(shape)
        codes = np.stack([b & 15, b >> 4], -1).reshape(shape[0], shape[1] * 2)
        sdt, sshape, sraw = t[name + ".scale"]
        return E2M1[codes] * np.repeat(e8m0(sraw, sshape), 32, 1)
    return plain(dt, shape, raw)


def write(path, tensors, metadata=None):
    """Writes {name: np.ndarray} (float32, bf16 given as ('BF16', uint16 array), int64)."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        v = tensors[name]
        if isinstance(v, tuple):
            dt, arr = v
        else:
            arr = v
            dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[arr.dtype]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)

"""Tensor names in a .safetensors file, read and renamed without torch.

The format (huggingface/safetensors, "Format" in its README): an unsigned little-endian 64-bit
header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets"}, "__metadata__": ...},
then the tensors' bytes, addressed by offsets relative to the end of the header. Renaming tensors
therefore rewrites the header only.

Used to hand a checkpoint's network weights to kohya as --network_weights: accelerate's save_state
writes the model with unwrap=False, so under DDP every name carries the wrapper's "module." prefix,
which kohya's non-strict load_state_dict would silently ignore.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

PREFIX = "module."
_MAX_HEADER = 100 * 1024 * 1024  # the format's own bound on the header


def read_header(path: Path) -> tuple[dict, int]:
    """(the JSON header, the offset where the tensors' bytes start)."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        return json.loads(f.read(n)), 8 + n


def names(path: Path) -> list[str]:
    return [k for k in read_header(path)[0] if k != "__metadata__"]


def unprefixed(src: Path, dest: Path, prefix: str = PREFIX) -> Path:
    """`src` itself when no tensor name starts with `prefix`, else a copy at `dest` with the
    prefix taken off every name (the bytes unchanged)."""
    header, start = read_header(src)
    if not any(k.startswith(prefix) for k in header if k != "__metadata__"):
        return src
    renamed = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in header.items()}
    body = json.dumps(renamed, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # the format pads the header with spaces to 8-byte alignment
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}")
    with src.open("rb") as fin, tmp.open("wb") as fout:
        fout.write(struct.pack("<Q", len(body)))
        fout.write(body)
        fin.seek(start)
        shutil.copyfileobj(fin, fout, 1 << 20)
    tmp.replace(dest)
    return dest


def write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict | None = None) -> None:
    """A safetensors file from {name: (dtype, shape, raw bytes)} (tests and small files)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"".join(blobs))


def tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """{name: (dtype, shape, raw bytes)} of a small file."""
    header, start = read_header(path)
    data = path.read_bytes()[start:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}

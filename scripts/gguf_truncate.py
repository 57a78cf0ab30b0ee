#!/usr/bin/env python3
"""Cut a (Kairox) GGUF down to its first N layers, for a model small enough to copy to a GPU
machine with the library (the device tool moves at most 64 MiB per call; the default model's
Kairox GGUF is 120 MB). Every tensor of the kept layers and every metadata key are copied as
they are, except: the block count becomes N, per-layer arrays (kairox.threshold, ...) keep
their first N entries, and the token embedding may be re-quantized (--embd-type q4_0: 30 MB
of Q8_0 -> 16 MB). The result is a smaller model of the same architecture and format, for runtime
checks (hybrid on a GPU vs the CPU-only path), not for quality.

    python3 scripts/gguf_truncate.py IN.gguf OUT.gguf --layers 6 [--embd-type q4_0]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

_LAYER = re.compile(r"^blk\.(\d+)\.")


def truncate(src: str, dst: str, n_layers: int, embd_type: str | None) -> None:
    """Write dst atomically (a temporary file renamed into place)."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    key_blocks = f"{arch}.block_count"
    n_old = int(r.fields[key_blocks].contents())
    if not 0 < n_layers <= n_old:
        raise SystemExit(f"--layers must be in 1..{n_old}")

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dst)), suffix=".tmp")
    os.close(fd)
    try:
        w = GGUFWriter(tmp, arch)
        for f in r.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue
            vtype = f.types[0]
            val = f.contents()
            if f.name == key_blocks:
                val = n_layers
            sub = None
            if vtype == GGUFValueType.ARRAY:
                sub = f.types[-1]
                if f.name.startswith("kairox.") and len(val) == n_old:
                    val = val[:n_layers]  # per-layer values
            w.add_key_value(f.name, val, vtype, sub_type=sub)

        for t in r.tensors:
            m = _LAYER.match(t.name)
            if m and int(m.group(1)) >= n_layers:
                continue
            data = np.asarray(t.data)
            qtype = t.tensor_type
            if t.name == "token_embd.weight" and embd_type:
                target = GGMLQuantizationType[embd_type.upper()]
                if target != qtype:
                    f32 = dequantize(data, qtype).reshape(-1, int(t.shape[0]))
                    data, qtype = quantize(f32, target), target
            w.add_tensor(t.name, data, raw_dtype=qtype)

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--embd-type", default=None, help="re-quantize token_embd (e.g. q4_0)")
    a = ap.parse_args()
    truncate(a.src, a.dst, a.layers, a.embd_type)
    print(f"{a.dst}: {os.path.getsize(a.dst) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

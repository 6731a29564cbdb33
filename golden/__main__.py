"""``python -m golden``: list, generate and save workloads; compute and check expected outputs.

    python -m golden list
    python -m golden generate gpt-oss build/wl/gpt-oss [--seed 1] [--contexts 1,100,4096]
    python -m golden expected build/wl/gpt-oss       # writes expected/, prints accuracy
    python -m golden compare DIR OUTPUTS             # OUTPUTS/<name>.npy against DIR's expected

Exit status: 0 when all is well; 1 when outputs differ or a manifest's scales make a value
saturate; 2 for a usage error or an input that cannot be read (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from golden.expected import accuracy, compute_expected
from golden.gemm import Saturation
from golden.io import compare, load_expected, load_workload, save_expected, save_workload
from golden.workloads import WORKLOADS, generate


def _contexts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("context lengths must be >= 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m golden", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered workloads and their shapes")
    gen = sub.add_parser("generate", help="generate a workload's tensors and save them")
    gen.add_argument("workload", choices=sorted(WORKLOADS))
    gen.add_argument("directory")
    gen.add_argument("--seed", type=int, help="override the config's seed")
    gen.add_argument("--contexts", type=_contexts, help="decode context lengths, e.g. 1,100,4096")
    gen.add_argument("--prefill-tokens", type=int, help="override the prefill length")
    exp = sub.add_parser("expected", help="compute the expected outputs of a saved workload")
    exp.add_argument("directory")
    exp.add_argument("--json", action="store_true", help="print the accuracy as JSON")
    cmp_ = sub.add_parser("compare", help="compare a dump of <name>.npy outputs bit for bit")
    cmp_.add_argument("directory", help="saved workload with expected outputs")
    cmp_.add_argument("actual", help="directory of <name>.npy outputs to check")
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except (ValueError, OSError) as error:
        print(f"python -m golden {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyError as error:  # a manifest without a scale or tensor the models need
        print(f"python -m golden {args.command}: the workload lacks {error}", file=sys.stderr)
        return 2


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "list":
        for name, cfg in WORKLOADS.items():
            print(f"{name:12s} heads {cfg.heads}:{cfg.kv_heads} head_dim {cfg.head_dim}/"
                  f"{cfg.v_head_dim} windows {list(cfg.windows)} sinks {cfg.sinks} "
                  f"page {cfg.page_size} | experts {cfg.experts} top-{cfg.top_k} "
                  f"shared {cfg.shared_experts} hidden {cfg.hidden} ffn {cfg.ffn}")
            print(f"{'':12s} shaped after {cfg.shaped_after}")
        return 0
    if args.command == "generate":
        wl = generate(args.workload, seed=args.seed, decode_context_lens=args.contexts,
                      prefill_tokens=args.prefill_tokens)
        path = save_workload(wl, args.directory)
        print(f"wrote {len(wl.tensors)} tensors and {path}")
        return 0
    if args.command == "expected":
        wl = load_workload(args.directory)
        start = time.perf_counter()
        saturation: dict[str, Saturation] = {}
        expected = compute_expected(wl, saturation=saturation)
        seconds = time.perf_counter() - start
        save_expected(args.directory, expected)
        report = accuracy(wl, expected, saturation)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for key, value in report.items():
                print(f"{key:32s} {value:.6f}")
            print(f"computed {len(expected)} outputs in {seconds:.2f} s -> "
                  f"{args.directory}/expected")
        clipped = {name: s for name, s in saturation.items() if s.saturated}
        for name, s in clipped.items():
            print(f"python -m golden: {name}: {s.saturated} of {s.outputs} values saturated "
                  f"at int8 (worst: {s.worst()}); the manifest's scales do not hold for "
                  "these inputs", file=sys.stderr)
        return 1 if clipped else 0
    expected = load_expected(args.directory)
    if not expected:
        raise ValueError(f"{args.directory} has no expected outputs; run `expected` first")
    mismatches = compare(expected, args.actual)
    for name, count in mismatches.items():
        print(f"{name:32s} {'ok' if count == 0 else f'{count} elements differ'}")
    return 0 if not any(mismatches.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m workflows.samples DIR`` writes the size-target samples into DIR;
``python -m workflows.samples --bundled`` rewrites the committed demo images."""

from __future__ import annotations

import argparse

from workflows.samples import SAMPLES_DIR, make_bundled_samples, make_sample_images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workflows.samples", description=__doc__)
    parser.add_argument("directory", nargs="?", help="where to write sample_<size>.jpg")
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument(
        "--bundled", action="store_true", help=f"rewrite the demo images in {SAMPLES_DIR}"
    )
    args = parser.parse_args(argv)
    seed = {} if args.seed is None else {"seed": args.seed}  # else each function's default
    if args.bundled:
        paths = make_bundled_samples(SAMPLES_DIR, **seed)
    elif args.directory:
        paths = make_sample_images(args.directory, **seed)
    else:
        parser.error("give a directory, or --bundled")
    for name, path in paths.items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

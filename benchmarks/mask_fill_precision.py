"""-1e9 against -inf as the causal mask's fill, with large unscaled scores, in fp32, bf16 and fp16.

    python benchmarks/mask_fill_precision.py [--out benchmarks/results/mask_fill_precision.json]

Prints where -1e9 overflows fp16 (it cannot be stored: fp16's largest finite value is 65504), and for
random scores of growing std (unscaled dot products grow like sqrt(d_k) x the q, k component spread)
whether the two fills give the same probabilities, with the softmax in fp32 (the project's pipeline)
and in the scores' own dtype.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from andrea_exp.report.static import DTYPES, mask_fill_precision

MAGNITUDES = (1e0, 1e1, 1e2, 1e3, 1e4, 3e4, 1e5, 1e6, 1e7, 1e8, 3e8, 1e9, 1e10)


def fill_in_dtype() -> list[dict]:
    """What -1e9 becomes in each dtype, by a cast and by masked_fill."""
    rows = []
    for name, dtype in DTYPES.items():
        cast = torch.tensor(-1e9).to(dtype).item()
        try:
            filled = torch.zeros(2, dtype=dtype).masked_fill(torch.tensor([False, True]), -1e9)[1].item()
            fill_text = f"{filled:g}"
        except RuntimeError as err:
            fill_text = "error: " + str(err).split("\n")[0]
        rows.append({"dtype": name, "largest_finite": torch.finfo(dtype).max, "cast_of_-1e9": cast,
                     "masked_fill_-1e9": fill_text})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mask_fill_precision.json"))
    args = parser.parse_args(argv)
    storage = fill_in_dtype()
    print("-1e9 in each dtype")
    print(f"{'dtype':6} {'largest finite':>15} {'cast of -1e9':>14}  masked_fill(-1e9)")
    for r in storage:
        print(f"{r['dtype']:6} {r['largest_finite']:>15.4g} {r['cast_of_-1e9']:>14.4g}  {r['masked_fill_-1e9']}")
    grid = mask_fill_precision(magnitudes=MAGNITUDES)
    print("\nrandom scores of std S, causal mask filled with -inf or -1e9 (T=32, a batch of 4)")
    print(f"{'dtype':6} {'S':>8} {'softmax':>8} {'max|dP|':>9} {'future mass -1e9':>17} {'non-finite rows':>16}  note")
    for r in grid:
        nonfinite = f"{r['nonfinite_rows_inf']}/{r['nonfinite_rows_1e9']}"
        diff = "-" if math.isnan(r["max_abs_diff"]) else f"{r['max_abs_diff']:.3g}"
        future = "-" if math.isnan(r["future_mass_1e9"]) else f"{r['future_mass_1e9']:.3g}"
        print(f"{r['dtype']:6} {r['magnitude']:>8.0e} {r['softmax']:>8} {diff:>9} {future:>17} {nonfinite:>16}  "
              f"{r['fill_error'] or ''}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"storage": storage, "grid": grid}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()

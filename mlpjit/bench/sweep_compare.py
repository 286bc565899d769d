"""A layer sweep's pairs against the planned pair (``tune_fp8_gemv.py compare``).

TUNED_H200, LATE_STEPS and the planner's rules take a pair only where it beat the planned
one by more than 3% in every round of a layer sweep back to back, and was no slower with a
server's norm between the layers (docs/KERNEL_NOTES.md). This reads the sweep's JSON (one
run back to back, optionally one with ``--norm-between``) and says, per shape and token
count, how each pair compares and which pass that rule. A down projection that triggers its
dependents at entry never passes: after down a server runs other kernels than mlpjit's,
which the trigger only lets in early (the back-to-back chain shows a gain it would not see).
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_GAIN = 0.03  # faster than the planned pair by more than this in every round


def _by_point(rows: Sequence[dict]) -> dict[tuple, dict[tuple, dict]]:
    out: dict[tuple, dict[tuple, dict]] = {}
    for r in rows:
        out.setdefault((r["shape"], r["tokens"]), {})[(r["gate_up"], r["down"])] = r
    return out


def compare(
    chain: Sequence[dict], norm: Sequence[dict] = (), min_gain: float = MIN_GAIN
) -> list[dict]:
    """Every pair that is not its point's planned one: its time over the planned pair's
    (``ratio``: of the means; ``worst_round``: the largest of the rounds' ratios, rounds
    paired in order), the same with the norm where ``norm`` timed it (``norm_ratio``), and
    ``passes``: worst_round < 1 - min_gain and, where timed, norm_ratio <= 1, with down's
    trigger after its wait. ValueError if a point has no planned pair."""
    with_norm = _by_point(norm)
    out = []
    for (shape, tokens), pairs in _by_point(chain).items():
        base = [r for r in pairs.values() if r["default"]]
        if not base:
            raise ValueError(f"{shape} at {tokens} tokens has no planned (default) pair")
        base = base[0]
        norm_pairs = with_norm.get((shape, tokens), {})
        norm_base = next((r for r in norm_pairs.values() if r["default"]), None)
        for key, r in pairs.items():
            if r["default"]:
                continue
            rounds = [a / b for a, b in zip(r["round_us"], base["round_us"], strict=False)]
            worst = max(rounds) if rounds else r["us"] / base["us"]
            norm_ratio = None
            if norm_base is not None and key in norm_pairs:
                norm_ratio = norm_pairs[key]["us"] / norm_base["us"]
            passes = (
                worst < 1 - min_gain
                and (norm_ratio is None or norm_ratio <= 1)
                and not key[1].endswith("/early")
            )
            out.append(
                {"shape": shape, "tokens": tokens, "gate_up": key[0], "down": key[1],
                 "planned": (base["gate_up"], base["down"]), "ratio": r["us"] / base["us"],
                 "worst_round": worst, "norm_ratio": norm_ratio, "passes": passes}
            )  # fmt: skip
    return out


def markdown(rows: Sequence[dict], only_passing: bool = False) -> str:
    lines = [
        "| shape | tokens | gate_up | down | / planned | worst round | with the norm | passes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if only_passing and not r["passes"]:
            continue
        norm = "-" if r["norm_ratio"] is None else f"{r['norm_ratio']:.3f}"
        lines.append(
            f"| {r['shape']} | {r['tokens']} | {r['gate_up']} | {r['down']} | "
            f"{r['ratio']:.3f} | {r['worst_round']:.3f} | {norm} | "
            f"{'**yes**' if r['passes'] else ''} |"
        )
    return "\n".join(lines)

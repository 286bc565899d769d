"""CPU tests of scripts/tune_fp8_stream.py's code (mlpjit/bench/tune_stream.py): the variants
it parses and the requests it emits for a warm (no GPU, no compile)."""

from __future__ import annotations

import pytest

from mlpjit.bench import tune_stream
from mlpjit.jit.spec import KernelRequest


@pytest.fixture(scope="module")
def tune():
    return tune_stream


def test_variants_parse(tune) -> None:
    V = tune.StreamVariant  # noqa: N806 (a class)
    assert tune.parse_variant("gemv") is None
    auto = tune.CLUSTER_AUTO
    assert tune.parse_variant("16x0") == V(16, 0, 1, 1, "", 0, False, "")
    assert tune.parse_variant("8x3b2c2") == V(8, 3, 2, 2, "", 0, False, "")
    assert tune.parse_variant("8x0b2g") == V(8, 0, 2, 1, "g", 0, False, "")
    assert tune.parse_variant("8x0b2c1d") == V(8, 0, 2, 1, "d", 0, False, "")
    assert tune.parse_variant("8x0b2k2") == V(8, 0, 2, 1, "", 2, False, "")
    assert tune.parse_variant("8x0b2kad") == V(8, 0, 2, 1, "d", auto, False, "")
    assert tune.parse_variant("8x3b2k2s") == V(8, 3, 2, 1, "", 2, True, "")
    assert tune.parse_variant("8x0b2kasg") == V(8, 0, 2, 1, "g", auto, True, "")
    assert tune.parse_variant("0x0ka-mma") == V(0, 0, 0, 1, "", auto, False, "mma")
    assert tune.parse_variant("8x0b2kad-x+mma") == V(8, 0, 2, 1, "d", auto, False, "x+mma")
    assert tune.parse_variant("0x0kast").tma and tune.parse_variant("8x0b2tg").tma
    assert tune.parse_variant("0x0katp").step_sums and not tune.parse_variant("0x0kat").step_sums
    assert tune.parse_variant("g0") == ("g", 0)
    assert tune.parse_variant("d12") == ("d", 12)
    assert tune.parse_variant("L") == ("L", 0, 0, 0, 0)
    assert tune.parse_variant("L16b1") == ("L", 16, 1, 0, 0)
    assert tune.parse_variant("L8b2s2x4") == ("L", 8, 2, 2, 4)
    for text in (
        "L",
        "L16b1",
        "L8b2s2x4",
        "8x0b2c1g",
        "8x0b2c1d",
        "16x0b1c1",
        "8x0b2c1k4",
        "8x0b2c1kag",
        "8x3b2c1k2s",
        "0x0c1ka-x",
        "8x0b2c1k2g-mma",
        "8x0b2c1-x+mma",
        "0x0c1kat",
        "0x0c1katp",
        "8x3b2c1k2std-mma",
    ):
        assert tune.variant_label(tune.parse_variant(text)) == text
    bad_layers = ("L8", "L8b", "Lb1", "L8x1", "L8b1s3", "Ls3x4", "Lt")
    bad_streams = ("8x0gd", "8x0b2e", "8x0b2k", "8x0b2kb", "8x0b2dk2", "8x0b2s", "8x0b2k2sd2",
                   "8x0-m", "8x0b2-x-mma", "8x0b2-mma+x", "8x0b2-xg", "8x0b2gt",
                   "8x0b2tt")  # fmt: skip
    for bad in ("", "16", "x4", "8x0b", "8x0c2b2", "gemv2", "g", "x1", *bad_streams, *bad_layers):
        with pytest.raises(ValueError, match="variant must be"):
            tune.parse_variant(bad)
    with pytest.raises(ValueError, match="share_x"):
        tune.parse_variant("8x0b2k1s")
    with pytest.raises(ValueError, match="'-x' leaves x out"):
        tune.parse_variant("8x0b2kas-x+mma")


def test_emit_writes_both_kernels_of_every_layer(tune, tmp_path) -> None:
    out = tmp_path / "requests.jsonl"
    code = tune.main(["--shapes", "glm5-tp8,deepseek-v3-shared-tp8", "--tokens", "1,8",
                      "--variants", "gemv,8x0b2c1", "--trace", "--emit", str(out)])  # fmt: skip
    assert code == 0
    requests = [KernelRequest.from_json_line(line) for line in out.read_text().splitlines()]
    kinds = {(r.kernel, r.params["swiglu"], r.params.get("trace", False)) for r in requests}
    # gate_up and down of fp8_gemv and of fp8_stream, and the trace builds of both
    assert kinds == {
        ("fp8_gemv", True, False), ("fp8_gemv", False, False),
        ("fp8_gemv", True, True), ("fp8_gemv", False, True),
        ("fp8_stream", True, False), ("fp8_stream", False, False),
        ("fp8_stream", True, True), ("fp8_stream", False, True),
    }  # fmt: skip
    assert len(requests) == len(set(r.to_json_line() for r in requests)) == 2 * 2 * 2 * 4
    # A pair of one half on each kernel has no trace build.
    out.unlink()
    assert tune.main(["--shapes", "glm5-tp8", "--tokens", "1", "--variants", "8x0b2d",
                      "--trace", "--emit", str(out)]) == 0  # fmt: skip
    assert not any("trace" in line for line in out.read_text().splitlines())


def test_gemv_alternatives_differ_from_the_pick_and_each_other(tune) -> None:
    from mlpjit.kernels.fp8_gemv import tuning

    for rows, k, tokens, swiglu in ((2304, 6144, 1, True), (7168, 1152, 8, False)):
        pick = tuning.choose_config(rows, k, tokens, swiglu)
        found = tune.gemv_alternatives(rows, k, tokens, swiglu)
        families = [(c.splits, c.slice_k, c.slices_per_warp) for c in found]
        assert 2 <= len(found) <= tune.ALTERNATIVES
        assert len(set(families)) == len(families)
        assert (pick.splits, pick.slice_k, pick.slices_per_warp) not in families


def test_an_alternative_replaces_one_half_only(tune) -> None:
    planned = tune.layer_requests(6144, 1152, 1, None)
    gate_up = tune.layer_requests(6144, 1152, 1, ("g", 0))
    down = tune.layer_requests(6144, 1152, 1, ("d", 1))
    assert gate_up[0] != planned[0] and gate_up[1] == planned[1]
    assert down[0] == planned[0] and down[1] != planned[1]
    with pytest.raises(ValueError, match="alternatives"):
        tune.layer_requests(6144, 1152, 1, ("d", 99))


def test_grid_alone(tune) -> None:
    shapes = tune.shapes_of(tune.argparse.Namespace(shapes="grid", grid=False))
    assert len(shapes) == 36 and "glm5-tp8" not in shapes


def test_grid_adds_the_off_table_shapes(tune) -> None:
    args = tune.argparse.Namespace(shapes="glm5-tp8", grid=True)
    shapes = tune.shapes_of(args)
    assert len(shapes) == 1 + 36
    assert shapes["h3072-i1152"] == (3072, 1152)


def test_grid_shapes_by_name(tune) -> None:
    args = tune.argparse.Namespace(shapes="h6144-i2816,glm5-tp8", grid=False)
    assert tune.shapes_of(args) == {"h6144-i2816": (6144, 2816), "glm5-tp8": (6144, 1536)}


def test_any_hidden_and_intermediate_by_name(tune) -> None:
    args = tune.argparse.Namespace(shapes="h2560-i2304", grid=False)
    assert tune.shapes_of(args) == {"h2560-i2304": (2560, 2304)}
    with pytest.raises(SystemExit, match="multiples of 128"):
        tune.main(["--shapes", "h2560-i2300", "--emit", "/dev/null"])


def test_unknown_shape_is_one_line(tune) -> None:
    with pytest.raises(SystemExit, match="--shapes: unknown"):
        tune.main(["--shapes", "nope", "--emit", "/dev/null"])


def test_a_one_kernel_layer_is_one_request(tune) -> None:
    (fused,) = tune.layer_requests(7168, 256, 1, ("L", 0, 0, 0, 0))
    traced = tune.layer_requests(7168, 256, 1, ("L", 8, 1, 3, 4), trace=True)[0]
    assert fused.kernel == traced.kernel == "fp8_layer"
    assert traced.params["trace"] is True and traced.params["blocks_per_warp"] == 1
    assert (traced.params["stages_gate_up"], traced.params["stages_down"]) == (3, 4)


def test_one_streamed_half_keeps_the_planned_gemv_kernel_for_the_other(tune) -> None:
    both = tune.layer_requests(6144, 1536, 8, tune.parse_variant("8x0b2"))
    gemv = tune.layer_requests(6144, 1536, 8, None)
    gate_up_only = tune.layer_requests(6144, 1536, 8, tune.parse_variant("8x0b2g"))
    down_only = tune.layer_requests(6144, 1536, 8, tune.parse_variant("8x0b2d"))
    assert [r.kernel for r in both] == ["fp8_stream", "fp8_stream"]
    assert gate_up_only == [both[0], gemv[1]]
    assert down_only == [gemv[0], both[1]]
    assert tune._streamed(tune.parse_variant("8x0b2g")) == (True, False)
    assert tune._streamed(tune.parse_variant("8x0b2d")) == (False, True)
    assert tune._streamed(tune.parse_variant("8x0b2")) == (True, True)
    assert tune._streamed(tune.parse_variant("g3")) == (False, False)
    assert tune._streamed(None) == (False, False)


def test_cluster_variants_request_the_cluster_form(tune) -> None:
    from mlpjit.kernels.fp8_stream import plan

    fixed = tune.layer_requests(6144, 1536, 4, tune.parse_variant("8x0b2k4"))
    assert [r.params["cluster"] for r in fixed] == [4, 4]
    auto = tune.layer_requests(7168, 256, 1, tune.parse_variant("8x0b2ka"))  # shared expert
    assert auto[0].params["cluster"] == plan.choose_cluster(512, 7168) == 8
    assert auto[1].params["cluster"] == plan.choose_cluster(7168, 256)
    grid_wide = tune.layer_requests(6144, 1536, 4, tune.parse_variant("8x0b2"))
    assert "cluster" not in grid_wide[0].params
    assert "share_x" not in auto[0].params and "share_x" not in grid_wide[0].params
    # share_x: clusters of at least 2, also where the planner's size is 1 (h6144-i2816 gate_up)
    assert plan.choose_cluster(5632, 6144) == 1
    shared = tune.layer_requests(6144, 2816, 8, tune.parse_variant("8x0b2kas"))
    assert [(r.params["cluster"], r.params["share_x"]) for r in shared] == [(2, True), (2, True)]


def test_tma_variants_reach_the_stream_requests_only(tune) -> None:
    plain = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0ka"))
    assert all("tma" not in r.params for r in plain)
    both = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0kat"))
    assert [r.params["tma"] for r in both] == [True, True]
    down = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0katd"))
    assert down[0].kernel == "fp8_gemv" and down[1].params["tma"] is True


def test_ablated_variants_reach_the_stream_requests_only(tune) -> None:
    plain = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0ka"))
    assert all("ablate" not in r.params for r in plain)
    both = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0ka-x+mma"))
    assert [r.params["ablate"] for r in both] == ["x+mma", "x+mma"]
    down = tune.layer_requests(6144, 1536, 1, tune.parse_variant("0x0kad-mma"))
    assert down[0].kernel == "fp8_gemv" and down[1].params["ablate"] == "mma"


def test_plot_rows_read_every_stored_form(tune) -> None:
    row = {"variant": "gemv", "tokens": 1, "mbytes": 28.3, "x_floor": 1.46}
    assert tune.plot_rows([row]) == [row]
    assert tune.plot_rows({"meta": {}, "rows": [row]}) == [row]
    bench = {"meta": {}, "results": [
        {"hidden": 6144, "intermediate": 1536, "tokens": 8, "floor_us": 6.8,
         "mlpjit_us": 10.2, "scaled_mm_us": 20.4},
        {"hidden": 6144, "intermediate": 1536, "tokens": 1, "floor_us": 6.8,
         "mlpjit_us": 6.8},
    ]}  # fmt: skip
    rows = tune.plot_rows(bench)
    assert [(r["variant"], r["tokens"]) for r in rows] == [
        ("DenseMlp", 8), ("2x _scaled_mm", 8), ("DenseMlp", 1),
    ]  # fmt: skip
    assert [round(r["x_floor"], 3) for r in rows] == [1.5, 3.0, 1.0]
    assert rows[0]["mbytes"] == 3 * 6144 * 1536 / 1e6


def test_plot_draws_a_png(tune, tmp_path) -> None:
    src = tmp_path / "grid.json"
    src.write_text(
        '{"meta": {}, "results": [{"hidden": 2048, "intermediate": 256, '
        '"tokens": 1, "floor_us": 0.4, "mlpjit_us": 3.2, "scaled_mm_us": 11.8}]}'
    )
    png = tmp_path / "grid.png"
    assert tune.main(["--plot", str(png), "--from-json", str(src)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spread_line_names_the_slow_sms_and_whether_they_repeat(tune) -> None:
    import torch

    from mlpjit.kernels.fp8_stream.params import TRACE_POINTS

    def launch(busy_ns: list[int], sms: list[int]) -> torch.Tensor:
        t = torch.zeros(len(sms), TRACE_POINTS, dtype=torch.int64)
        t[:, 0] = 1000
        t[:, 4] = 1000 + torch.tensor(busy_ns)
        t[:, -1] = torch.tensor(sms)
        return t

    blocks = torch.tensor([10.0, 10.0, 10.0, 10.0])
    sms = [3, 0, 2, 1]
    busy = [2000, 1000, 1500, 1200]  # SM 3 is the slowest, then SM 2
    line = tune._spread_line([launch(busy, sms), launch(busy, sms)], blocks)
    assert "max 2.00" not in line and line.endswith("slowest SMs [3, 2, 1, 0]")
    assert "busy us p10/p50/p90/max" in line and "/2.00 " in line
    assert "launch 1 vs 2..) 1.00" in line
    flipped = tune._spread_line([launch(busy, sms), launch(busy[::-1], sms)], blocks)
    assert "launch 1 vs 2..) -" in flipped  # the slow SMs moved: negative correlation


def test_gemv_spread_line_splits_each_ctas_time_after_the_wait(tune) -> None:
    import torch

    from mlpjit.kernels.fp8_gemv.params import TRACE_NAMES, TRACE_POINTS

    at = dict.fromkeys(TRACE_NAMES, 0)
    stamps = torch.zeros(4, TRACE_POINTS, dtype=torch.int64)
    for cta in range(4):  # ns: x 400 + 100 * cta, sums 1000, store 300
        at.update(waited=500, **{"x ready": 900 + 100 * cta})
        at["sums last"] = at["x ready"] + 1000
        at["done"] = at["sums last"] + 300
        stamps[cta, : len(TRACE_NAMES)] = torch.tensor([at[n] for n in TRACE_NAMES])
        stamps[cta, -1] = 7 if cta < 3 else 2  # three CTAs on SM 7
    line = tune.gemv_spread_line(stamps)
    assert "x 0.43/0.55/0.67/0.70" in line
    assert "sums 1.00/1.00/1.00/1.00" in line and "store 0.30/0.30/0.30/0.30" in line
    assert "busy 1.73/1.85/1.97/2.00" in line and line.endswith("CTAs per SM <= 3")


def test_stamp_cells_give_each_stamps_median_and_latest_cta(tune) -> None:
    import torch

    stamps = torch.tensor([[1000, 2000, 7], [1000, 4000, 7], [1500, 3000, 9]])
    names = ("start", "end")
    assert tune._stamp_cells(stamps, 500, names) == "start 0.50/1.00  end 2.50/3.50"
    assert tune._stamp_cells(stamps, 500, names, (1,)) == "end 2.50/3.50"


def test_beside_line_counts_down_ctas_that_shared_an_sm_with_gate_up(tune) -> None:
    import torch

    from mlpjit.kernels.fp8_stream.params import TRACE_POINTS

    def stamps(rows: list[tuple[int, int, int]]) -> torch.Tensor:  # (start, end, SM)
        t = torch.zeros(len(rows), TRACE_POINTS, dtype=torch.int64)
        for i, (start, end, sm) in enumerate(rows):
            t[i, 0], t[i, 7], t[i, -1] = start, end, sm
        return t

    gate_up = stamps([(0, 100, 0), (0, 300, 1)])
    # down CTA 0 starts on SM 1 while gate_up's CTA there runs; CTA 1 on SM 0 after its
    # gate_up CTA ended but before the last one did; CTA 2 after both
    down = stamps([(50, 400, 1), (150, 400, 0), (350, 500, 0)])
    line = tune._beside_line(gate_up, down)
    assert line.startswith("1 of 3 down CTAs started beside") and "2 before gate_up's" in line


@pytest.mark.parametrize(
    "argv", [["--rounds", "0"], ["--replays", "0"], ["--warmup", "-1"]], ids=str
)
def test_timing_counts_are_checked(tune, argv, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tune.main([*argv, "--emit", "/dev/null"])
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err


def test_norm_between_emits_the_same_requests(tune, tmp_path) -> None:
    plain, norm = tmp_path / "plain.jsonl", tmp_path / "norm.jsonl"
    base = ["--shapes", "glm5-tp8", "--tokens", "1", "--variants", "gemv,0x0ka"]
    assert tune.main([*base, "--emit", str(plain)]) == 0
    assert tune.main([*base, "--norm-between", "--emit", str(norm)]) == 0
    assert norm.read_text() == plain.read_text() != ""

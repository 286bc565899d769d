"""The read-floor benchmark's configs, params and compile requests (its timing runs on a GPU:
tests/gpu/test_read_floor_gpu.py checks the kernel's reads)."""

from __future__ import annotations

import json

import pytest

from mlpjit.bench import read_floor
from mlpjit.bench.read_floor import RING_BUDGET, chains, layer_reads, parse_config, read_params


def test_parse_config_reads_every_field() -> None:
    c = parse_config("r2048x16s4w12g264")
    assert (c.copy_bytes, c.copies, c.stages, c.warps, c.ctas) == (2048, 16, 4, 12, 264)
    c = parse_config("c32768")
    assert (c.copy_bytes, c.copies, c.stages, c.warps, c.ctas) == (32768, None, None, 8, 132)
    assert parse_config("r2048x16t").tensor and not parse_config("r2048x16").tensor


def test_tensor_configs_take_row_copies_and_two_kernel_chains() -> None:
    with pytest.raises(ValueError, match="'t' .* takes row copies"):
        parse_config("c32768t")
    chains_of = chains(parse_config("r2048x16t"), 6144, 1536)
    assert list(chains_of) == ["gate_up", "down", "layer"]
    assert all(p.tensor and p.copies == 16 for ps in chains_of.values() for p in ps)


def test_dynamic_configs_claim_after_a_fixed_start_in_two_kernel_chains() -> None:
    c = parse_config("r2048x16s4d2")
    assert (c.stages, c.dynamic) == (4, 2) and parse_config("c32768").dynamic == 0
    with pytest.raises(ValueError, match="d<N> takes N >= 1"):
        parse_config("r2048x16d0")
    chains_of = chains(parse_config("c32768d3"), 6144, 1536)
    assert list(chains_of) == ["gate_up", "down", "layer"]
    assert all(p.dynamic == 3 for ps in chains_of.values() for p in ps)


@pytest.mark.parametrize("text", ["", "r2048", "x16", "c", "r2048x16q", "c1024x2", "c32768d"])
def test_parse_config_refuses_with_the_grammar(text) -> None:
    with pytest.raises(ValueError, match="r<copy>x<copies> or c<copy>"):
        parse_config(text)


def test_row_configs_stream_like_fp8_stream() -> None:
    """GLM-5 TP 8's down rows are 1536 B: a 2048-byte copy becomes the whole row; the ring
    takes as many stages as fit the budget."""
    rows, k = layer_reads(6144, 1536)["down"]
    p = read_params(parse_config("r2048x16"), rows, k)
    assert (p.copy_bytes, p.copies, p.row_bytes, p.nbytes) == (1536, 16, 1536, rows * k)
    assert p.stages == RING_BUDGET // (16 * 1536)
    p = read_params(parse_config("r2048x16s2"), *layer_reads(6144, 1536)["gate_up"])
    assert (p.copy_bytes, p.stages, p.row_bytes) == (2048, 2, 6144)


def test_contiguous_configs_read_whole_copies() -> None:
    rows, k = 7168, 2304  # not a multiple of 32 KB
    p = read_params(parse_config("c32768"), rows, k)
    assert (p.copies, p.row_bytes, p.copy_bytes) == (1, 32768, 32768)
    assert p.nbytes == rows * k // 32768 * 32768 and p.stages == RING_BUDGET // 32768


def test_chains_read_the_layer_as_two_kernels_or_one() -> None:
    per_chain = chains(parse_config("r2048x16"), 6144, 1536)
    assert list(per_chain) == ["gate_up", "down", "layer", "fused", "flat"]
    gate_up, down = per_chain["layer"]
    (fused,) = per_chain["fused"]
    assert per_chain["gate_up"] == [gate_up] and per_chain["down"] == [down]
    assert fused.barrier and not per_chain["flat"][0].barrier
    assert fused.total_bytes == gate_up.nbytes + down.nbytes
    assert (fused.then_row_bytes, fused.then_copy_bytes) == (1536, 1536)
    assert fused.stages == RING_BUDGET // (16 * 2048)  # slots of the larger stage


def test_emit_writes_warmable_requests(tmp_path) -> None:
    out = tmp_path / "read.jsonl"
    assert read_floor.main(["--emit", str(out), "--shapes", "glm5-tp8,deepseek-v3-shared-tp8",
                            "--configs", "r2048x16,c32768"]) == 0  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["kernel"] for line in lines} == {"read_floor"}
    # Two matrices and two one-kernel layers x two configs x two shapes; the shared
    # expert's 1.8 MB down in 32 KB copies is 56 stages, one per CTA (and so its one-kernel
    # layers); its gate_up has 128 stages of 16 x 1792 B.
    assert len(lines) == 16
    assert {line["params"]["ctas"] for line in lines} == {132, 128, 112, 56}


def test_bad_arguments_exit_with_usage(capsys) -> None:
    with pytest.raises(SystemExit):
        read_floor.main(["--configs", "z1"])
    assert "config must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        read_floor.main(["--shapes", "nope"])
    assert "unknown" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        read_floor.main(["--chains", "layer,bogus"])
    assert "--chains takes gate_up, down, layer, fused, flat, got bogus" in capsys.readouterr().err

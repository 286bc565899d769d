"""Dense-MLP weights from a Hugging Face FP8 checkpoint (DeepSeek-V3 layout), one TP shard.

    weights = load_dense_mlp_weights("/models/GLM-5-FP8", "model.layers.0.mlp", tp_rank=r,
                                     tp_size=8, device="cuda")
    mlp = DenseMlp(**weights, ue8m0=True)

The layout (DeepSeek-V3, Kimi-K2, GLM-4.5/5 FP8 releases): ``{prefix}.gate_proj.weight``,
``.up_proj.weight`` and ``.down_proj.weight`` in float8_e4m3fn, each with its block scales in
``.weight_scale_inv`` (or ``.weight_scale``, compressed-tensors' name; both multiply: weight =
fp8 * scale), float32 [N/128, K/128], float8_e8m0fnu, or UE8M0 bytes packed four per int32
along K (the forms mlpjit.scales takes). The tensors live in ``model.safetensors`` or in the
shards a ``model.safetensors.index.json`` lists; ``config.json``'s ``quantization_config``
must give 128x128 blocks.

Only the shard's bytes are read: safetensors' ``get_slice`` maps the file and the slices
touch just the rows (gate, up) and columns (down) of the shard. The split is the one vLLM's
merged column-parallel gate_up and row-parallel down layers make: rank r of tp gets
intermediate rows [r*I/tp, (r+1)*I/tp) of gate and of up (merged into w13, gate rows first),
the same columns of down, and the scale blocks that cover them, so I/tp must be a multiple
of 128. Scales come back as float32 (an exact conversion) on ``device``; every tensor
returned is a fresh contiguous copy, never a view of the mapped file.

Every failure is a one-line UsageError (a ValueError) naming the tensor and the file: a
missing tensor or index entry, a wrong dtype or shape, a corrupt or truncated file
(safetensors' own header checks, plus the e4m3 NaN byte in a weight and non-finite or
negative scales), a block size other than [128, 128], a shard size that is not a multiple
of 128.

A broken checkpoint cannot hang or exhaust a server either: every file is opened as a
regular file first (a FIFO, a link to /dev/zero or a directory is refused by name, never
opened by safetensors or read), config.json and the index are read with a size cap
(MAX_CONFIG_BYTES, MAX_INDEX_BYTES) and parsed with mlpjit.jit.safe_read's JSON loader
(deep nesting is an error, not a RecursionError), and every number config.json gives is
bounded (mlpjit.jit.bounds): sizes by fp8_gemv's MAX_HIDDEN and MAX_INTERMEDIATE, layer
counts by MAX_LAYERS. Symbolic links are followed (the Hugging Face cache links every file
to its blob).

``find_mlp_prefixes`` lists a checkpoint's dense MLPs and shared experts from its tensor
names; ``checkpoint_mlp_shapes`` gives (prefix, hidden, intermediate) per layer from
config.json, checked against the tensor shapes in the files' headers (no data read), which
is what ``mlpjit warm --checkpoint`` plans from.

torch and safetensors are imported when a function needs them, never at import.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlpjit.errors import MissingDependencyError, UsageError
from mlpjit.jit.bounds import bounded
from mlpjit.jit.safe_read import loads_json, open_regular
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.fp8_gemv.params import MAX_HIDDEN, MAX_INTERMEDIATE

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "MAX_CONFIG_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_LAYERS",
    "MAX_SHARED_EXPERTS",
    "SINGLE_FILE",
    "checkpoint_mlp_shapes",
    "find_mlp_prefixes",
    "load_dense_mlp_weights",
    "shard_range",
]

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Released configs are a few KB; DeepSeek-V3's and Kimi-K2's indexes about 10 MB.
MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 256 << 20
# Layers a config may give (DeepSeek-V3: 61, Llama-3.1-405B: 126): a layer count is turned
# into a list per layer, so 1e12 would be a MemoryError and 1e9 a hang.
MAX_LAYERS = 1024
MAX_SHARED_EXPERTS = 64  # DeepSeek-V3, Kimi-K2 and GLM have 1

_PROJS = ("gate_proj", "up_proj", "down_proj")
_SCALE_NAMES = ("weight_scale_inv", "weight_scale")  # first found wins
_WEIGHT_DTYPE = "F8_E4M3"  # safetensors' name of float8_e4m3fn
_SCALE_DTYPES = ("F32", "F8_E8M0", "I32")  # float32, float8_e8m0fnu, packed UE8M0
# A dense MLP or shared expert: ...layers.N.mlp[.shared_experts].{gate,up,down}_proj.weight
_MLP_WEIGHT = re.compile(
    r"^(?P<prefix>(?:.+\.)?layers\.(?P<layer>\d+)\.mlp(?P<shared>\.shared_experts)?)"
    r"\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


def _one_line(text: object) -> str:
    """``text`` with its whitespace runs collapsed: error messages stay one line."""
    return " ".join(str(text).split())


# ---- the checkpoint's files ------------------------------------------------------------------


def _checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory, or a ValueError naming the path."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(
            f"checkpoint {root} is not a directory (expected a Hugging Face dir)", path=str(root)
        )
    return root


def _open_checked(file: Path) -> int:
    """An fd of ``file`` opened read-only if it is a regular file (symlinks followed);
    a one-line ValueError naming the file otherwise (missing, a FIFO, a device ...)."""
    try:
        fd, _ = open_regular(file, follow_symlinks=True)
    except FileNotFoundError:
        raise UsageError(f"{file} is missing", path=str(file)) from None
    except OSError as exc:
        raise UsageError(f"{file} is unreadable: {_one_line(exc)}", path=str(file)) from None
    except ValueError as exc:  # open_regular's names the file and its type
        raise UsageError(str(exc), path=str(file)) from None
    return fd


def _check_regular(file: Path) -> None:
    """ValueError naming ``file`` unless it is a regular file: safetensors opens and maps
    what it is given, and opening a FIFO waits forever for a writer."""
    os.close(_open_checked(file))


def _read_json(file: Path, max_bytes: int) -> dict[str, Any]:
    """A JSON object from the regular file ``file`` of at most ``max_bytes`` bytes; a
    one-line ValueError naming the file otherwise."""
    fd = _open_checked(file)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UsageError(f"{file} is {size} bytes, over the {max_bytes} byte limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(max_bytes + 1)  # + 1: a file that grows while read is caught
    except OSError as exc:
        raise UsageError(f"{file} is unreadable: {_one_line(exc)}") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise UsageError(f"{file} grew past the {max_bytes} byte limit while being read")
    try:
        data = loads_json(raw)
    except ValueError as exc:
        raise UsageError(f"{file} is unreadable: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{file} is not a JSON object", path=str(file))
    return data


def _read_config(root: Path) -> tuple[dict[str, Any], Path]:
    """config.json and its path."""
    file = root / CONFIG_FILE
    return _read_json(file, MAX_CONFIG_BYTES), file


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: ``text_config`` in multimodal configs."""
    text = config.get("text_config")
    if "hidden_size" not in config and isinstance(text, dict):
        return text
    return config


@dataclass(frozen=True)
class _WeightMap:
    """Which file holds which tensor: the index's weight_map, or the single file's keys."""

    root: Path
    files: dict[str, str]  # tensor name -> file name relative to root
    listing: Path  # where the names come from: the index, or the single file

    def file_of(self, name: str) -> Path:
        """The file holding tensor ``name``; ValueError naming both when it is not listed."""
        relative = self.files.get(name)
        if relative is None:
            raise UsageError(f"tensor {name} is missing: {self.listing} does not list it")
        return self.root / relative


def _safe_open() -> Any:
    """safetensors' safe_open; without safetensors (not in mlpjit's main install) a
    one-line MissingDependencyError naming the extra that installs it."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise MissingDependencyError(
            "reading a checkpoint needs safetensors: pip install 'mlpjit[checkpoint]'"
        ) from None
    return safe_open


def _single_file_keys(file: Path) -> dict[str, str]:
    """{tensor name: file name} of a checkpoint stored as one safetensors file."""
    safe_open = _safe_open()
    _check_regular(file)
    try:
        with safe_open(str(file), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), file.name)
    except Exception as exc:  # SafetensorError, OSError: a corrupt or unreadable file
        raise UsageError(f"{file} is unreadable: {_one_line(exc)}") from None


def _read_weight_map(root: Path) -> _WeightMap:
    """The tensor -> file map from model.safetensors.index.json, else model.safetensors."""
    index = root / INDEX_FILE
    if index.exists():
        files = _read_json(index, MAX_INDEX_BYTES).get("weight_map")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise UsageError(f"{index} has no weight_map of tensor names to file names")
        return _WeightMap(root, files, index)
    single = root / SINGLE_FILE
    if single.exists():
        return _WeightMap(root, _single_file_keys(single), single)
    raise UsageError(f"checkpoint {root} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def _config_block_size(quant: dict[str, Any]) -> object:
    """The weight block size a quantization_config declares (None when it has none):
    ``weight_block_size`` (quant_method fp8), or compressed-tensors' ``block_structure``
    of its config groups when they all agree."""
    if "weight_block_size" in quant:
        return quant["weight_block_size"]
    groups = quant.get("config_groups")
    if not isinstance(groups, dict):
        return None
    blocks = [
        g["weights"].get("block_structure")
        for g in groups.values()
        if isinstance(g, dict) and isinstance(g.get("weights"), dict)
    ]
    distinct = {json.dumps(b) for b in blocks}
    return blocks[0] if len(distinct) == 1 else blocks or None


def _check_block_size(config: dict[str, Any], config_file: Path) -> None:
    """ValueError naming the value and the file unless the checkpoint's FP8 weights use
    128x128 blocks (the only block scaling DenseMlp's kernels and stock path take)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        raise UsageError(f"{config_file} has no quantization_config: not an FP8 checkpoint")
    block = _config_block_size(quant)
    if not isinstance(block, (list, tuple)) or list(block) != [BLOCK, BLOCK]:
        raise UsageError(
            f"{config_file}: quantization_config.weight_block_size is {block!r}; mlpjit takes "
            f"only [{BLOCK}, {BLOCK}] block-scaled FP8 weights"
        )


def checkpoint_ue8m0(path: str | Path) -> bool | None:
    """The activation-scale rule the checkpoint's config.json gives: True for
    ``quantization_config.scale_fmt: "ue8m0"`` (DeepSeek-V3.1 style), False for any other
    scale_fmt, None when it gives none (then mlpjit.scale_rule.DEFAULT_UE8M0 applies).
    A one-line ValueError naming the file for an unreadable config or a scale_fmt that is
    not a string."""
    from mlpjit.scale_rule import quantization_ue8m0

    config, config_file = _read_config(_checkpoint_dir(path))
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    return quantization_ue8m0(quant, f"{config_file}: quantization_config")


# ---- tensor metadata and slices -------------------------------------------------------------


@dataclass(frozen=True)
class _TensorInfo:
    """One tensor as its file's header describes it (no data read)."""

    name: str
    file: Path
    dtype: str  # safetensors' dtype name, e.g. "F8_E4M3"
    shape: tuple[int, ...]

    def error(self, problem: str) -> UsageError:
        """A UsageError naming this tensor and its file."""
        return UsageError(f"{self.name} in {self.file}: {problem}", path=str(self.file))


class _Reader:
    """The safetensors files of one checkpoint, each opened once, for headers and slices.

    A file that safetensors cannot open (missing, truncated, a corrupt header) or a tensor
    it cannot slice gives a one-line ValueError naming the tensor and the file. Slices are
    views of the mapped file, valid while the reader is open: copy what you keep.
    """

    def __init__(self, weights: _WeightMap) -> None:
        self._weights = weights
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _handle(self, name: str, file: Path) -> Any:
        """The open safe_open handle of ``file`` (opened on first use, on the CPU)."""
        handle = self._handles.get(file)
        if handle is None:
            safe_open = _safe_open()
            try:
                _check_regular(file)
            except ValueError as exc:
                raise UsageError(f"{name} in {file}: cannot open: {exc}") from None
            try:
                handle = self._stack.enter_context(safe_open(str(file), framework="pt"))
            except Exception as exc:  # SafetensorError, OSError
                raise UsageError(f"{name} in {file}: cannot open: {_one_line(exc)}") from None
            self._handles[file] = handle
        return handle

    def info(self, name: str) -> _TensorInfo:
        """Dtype and shape of tensor ``name`` from its file's header."""
        file = self._weights.file_of(name)
        handle = self._handle(name, file)
        try:
            piece = handle.get_slice(name)
            return _TensorInfo(name, file, piece.get_dtype(), tuple(piece.get_shape()))
        except Exception as exc:  # SafetensorError: not in this file
            raise UsageError(
                f"tensor {name} is missing from {file} ({self._weights.listing.name} lists it "
                f"there): {_one_line(exc)}"
            ) from None

    def read(self, info: _TensorInfo, rows: slice, cols: slice) -> Tensor:
        """The [rows, cols] slice of a 2-D tensor, as a CPU view of the mapped file."""
        try:
            return self._handle(info.name, info.file).get_slice(info.name)[rows, cols]
        except Exception as exc:  # SafetensorError, OSError: unreadable data
            raise info.error(f"cannot read [{rows}, {cols}]: {_one_line(exc)}") from None


def _rows_on(parts: list[Tensor], device: torch.device | str) -> Tensor:
    """The row-wise concatenation of ``parts`` as one fresh contiguous tensor on ``device``
    (one allocation, each part copied into place: never a view of the mapped file, and no
    intermediate copy on the device)."""
    import torch

    rows = sum(p.shape[0] for p in parts)
    out = torch.empty((rows, *parts[0].shape[1:]), dtype=parts[0].dtype, device=device)
    start = 0
    for part in parts:
        out[start : start + part.shape[0]].copy_(part)
        start += part.shape[0]
    return out


# ---- one layer's tensors --------------------------------------------------------------------


def _scale_name(prefix: str, proj: str, weights: _WeightMap) -> str:
    """The name of ``proj``'s block-scale tensor: weight_scale_inv, else weight_scale."""
    for suffix in _SCALE_NAMES:
        name = f"{prefix}.{proj}.{suffix}"
        if name in weights.files:
            return name
    names = " or ".join(f"{prefix}.{proj}.{s}" for s in _SCALE_NAMES)
    raise UsageError(f"tensor {names} is missing: {weights.listing} lists neither")


def _check_weight(info: _TensorInfo, shape: tuple[int, int]) -> None:
    """An FP8 e4m3 weight of exactly ``shape``."""
    if info.dtype != _WEIGHT_DTYPE:
        raise info.error(f"dtype {info.dtype}, expected {_WEIGHT_DTYPE} (float8_e4m3fn)")
    if info.shape != shape:
        raise info.error(f"shape {list(info.shape)}, expected {list(shape)}")


def _check_scale(info: _TensorInfo, rows: int, k: int) -> None:
    """Block scales of a weight [rows, k] in one of the forms mlpjit.scales converts."""
    blocks = (rows // BLOCK, k // BLOCK)
    expected = {"F32": blocks, "F8_E8M0": blocks, "I32": (blocks[0], -(-blocks[1] // 4))}
    if info.dtype not in expected:
        raise info.error(f"dtype {info.dtype}, expected one of {', '.join(_SCALE_DTYPES)}")
    if info.shape != expected[info.dtype]:
        raise info.error(
            f"shape {list(info.shape)}, expected {list(expected[info.dtype])} for a "
            f"{info.dtype} scale of a [{rows}, {k}] weight in {BLOCK}x{BLOCK} blocks"
        )


def _layer_infos(
    reader: _Reader, prefix: str, weights: _WeightMap
) -> tuple[dict[str, _TensorInfo], int, int]:
    """The six tensors of one MLP, checked against each other: gate and up [I, H], down
    [H, I], their scales; H and I multiples of 128. Returns (infos by role, H, I); roles
    are "gate_proj", "gate_proj.scale", ... ."""
    infos = {}
    for proj in _PROJS:
        infos[proj] = reader.info(f"{prefix}.{proj}.weight")
        infos[f"{proj}.scale"] = reader.info(_scale_name(prefix, proj, weights))
    gate = infos["gate_proj"]
    if len(gate.shape) != 2 or min(gate.shape) < BLOCK or any(d % BLOCK for d in gate.shape):
        raise gate.error(
            f"shape {list(gate.shape)}, expected [intermediate, hidden], both multiples of {BLOCK}"
        )
    inter, hidden = gate.shape
    for proj, (rows, k) in (
        ("gate_proj", (inter, hidden)),
        ("up_proj", (inter, hidden)),
        ("down_proj", (hidden, inter)),
    ):
        _check_weight(infos[proj], (rows, k))
        _check_scale(infos[f"{proj}.scale"], rows, k)
    return infos, hidden, inter


def shard_range(intermediate: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """Intermediate rows [lo, hi) of TP rank ``tp_rank`` of ``tp_size``: equal shards of a
    multiple of 128 rows (a scale block is never split). ValueError naming the intermediate
    size and tp otherwise."""
    for name, value, low in (("tp_size", tp_size, 1), ("tp_rank", tp_rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{name} must be an int >= {low}, got {value!r}")
    if tp_rank >= tp_size:
        raise UsageError(f"tp_rank must be < tp_size ({tp_size}), got {tp_rank}")
    size, rest = divmod(intermediate, tp_size)
    if rest or size % BLOCK or size == 0:
        raise UsageError(
            f"intermediate size {intermediate} does not split into tp={tp_size} shards of a "
            f"multiple of {BLOCK} rows ({intermediate}/{tp_size} = {intermediate / tp_size:g})"
        )
    return tp_rank * size, (tp_rank + 1) * size


def _check_fp8_values(w: Tensor, info: _TensorInfo) -> None:
    """Refuse e4m3 NaN bytes (0x7F, 0xFF) in a weight slice: no quantizer writes them (it
    saturates at +-448), so they mean a corrupt file, and would give NaN outputs."""
    import torch

    bad = (w.view(torch.uint8) & 0x7F) == 0x7F
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise info.error(
            f"{int(bad.sum())} float8_e4m3fn NaN bytes (0x7F/0xFF) in the slice read, first at "
            f"[{i}, {j}] of the slice: the file is corrupt"
        )


def _read_weight(reader: _Reader, info: _TensorInfo, rows: slice, cols: slice) -> Tensor:
    """One weight slice, value-checked, as a CPU view of the mapped file."""
    view = reader.read(info, rows, cols)
    _check_fp8_values(view, info)
    return view


def _read_scale(reader: _Reader, info: _TensorInfo, rows: slice, cols: slice, k: int) -> Tensor:
    """Float32 block scales (on the CPU) of weight rows ``rows`` and columns ``cols``
    (128-aligned slices of a weight with ``k`` columns) from any scale form, checked
    (finite, >= 0).

    Packed UE8M0 holds four blocks per int32 word along K, so a shard's column blocks need
    not start on a word: the words covering them are read and unpacked, and the shard's
    blocks cut from those (padding bytes past the last block are never looked at).
    """
    from mlpjit.scales import to_float32_scale

    r0, r1 = rows.start // BLOCK, rows.stop // BLOCK
    c0, c1 = cols.start // BLOCK, cols.stop // BLOCK
    name = f"{info.name} in {info.file}"
    n = rows.stop - rows.start
    if info.dtype != "I32":
        view = reader.read(info, slice(r0, r1), slice(c0, c1))
        return to_float32_scale(view, n, (c1 - c0) * BLOCK, name=name)
    w0, w1 = c0 // 4, -(-c1 // 4)
    window = min(4 * w1, k // BLOCK) - 4 * w0  # blocks the words [w0, w1) hold
    view = reader.read(info, slice(r0, r1), slice(w0, w1))
    scale = to_float32_scale(view, n, window * BLOCK, name=name)
    return scale[:, c0 - 4 * w0 : c1 - 4 * w0]


def load_dense_mlp_weights(
    path: str | Path,
    prefix: str,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, Tensor]:
    """One TP shard of the dense MLP (or shared expert) ``prefix`` of the checkpoint at
    ``path``, as DenseMlp's arguments: {"w13", "w13_scale", "w2", "w2_scale"}.

    w13 is float8_e4m3fn [2*I/tp, H] (this rank's gate rows, then its up rows), w2
    [H, I/tp] (its down columns); the scales float32 [2*I/tp/128, H/128] and
    [H/128, I/tp/128]. All are fresh contiguous tensors on ``device``; only the shard's
    slices are read from the files. ``prefix`` is e.g. ``model.layers.0.mlp`` or
    ``model.layers.5.mlp.shared_experts`` (see find_mlp_prefixes). Raises a one-line
    ValueError naming the tensor and the file for anything wrong with the checkpoint, or
    naming ``device`` when it is not "cpu" or a CUDA device that exists here.
    """
    from mlpjit.device import check_device

    device = check_device(device)  # before any file is read
    root = _checkpoint_dir(path)
    config, config_file = _read_config(root)
    _check_block_size(config, config_file)
    weights = _read_weight_map(root)
    with _Reader(weights) as reader:
        infos, hidden, inter = _layer_infos(reader, prefix, weights)
        try:
            lo, hi = shard_range(inter, tp_rank, tp_size)
        except ValueError as exc:
            raise UsageError(f"{prefix} ({infos['gate_proj'].file}): {exc}") from None
        shard, full = slice(lo, hi), slice(0, hidden)
        gate, up, down = (infos[p] for p in _PROJS)
        gate_scale, up_scale, down_scale = (infos[f"{p}.scale"] for p in _PROJS)
        # w13: this rank's gate rows, then its up rows (and their scale blocks alike)
        w13 = _rows_on([_read_weight(reader, w, shard, full) for w in (gate, up)], device)
        w13_scale = _rows_on(
            [_read_scale(reader, s, shard, full, hidden) for s in (gate_scale, up_scale)],
            device,
        )
        w2 = _rows_on([_read_weight(reader, down, full, shard)], device)
        w2_scale = _rows_on([_read_scale(reader, down_scale, full, shard, inter)], device)
    return {"w13": w13, "w13_scale": w13_scale, "w2": w2, "w2_scale": w2_scale}


# ---- listing a checkpoint's MLPs ------------------------------------------------------------


def _mlp_prefixes(names: Iterable[str]) -> dict[str, list[tuple[int, str]]]:
    """(layer, prefix) of every dense MLP and shared expert whose gate, up and down weights
    are all named, by kind ("dense", "shared_experts"), sorted by layer."""
    seen: dict[tuple[str, int, str], set[str]] = {}
    for name in names:
        match = _MLP_WEIGHT.match(name)
        if match:
            kind = "shared_experts" if match["shared"] else "dense"
            seen.setdefault((kind, int(match["layer"]), match["prefix"]), set()).add(match["proj"])
    found: dict[str, list[tuple[int, str]]] = {"dense": [], "shared_experts": []}
    for (kind, layer, prefix), projs in seen.items():
        if projs == set(_PROJS):
            found[kind].append((layer, prefix))
    return {kind: sorted(items) for kind, items in found.items()}


def find_mlp_prefixes(path: str | Path) -> dict[str, list[str]]:
    """The dense-MLP and shared-expert prefixes of the checkpoint at ``path``, sorted by
    layer: {"dense": ["model.layers.0.mlp", ...], "shared_experts":
    ["model.layers.3.mlp.shared_experts", ...]}.

    From the index's weight_map (or the single file's tensor names): a prefix counts when
    its gate_proj, up_proj and down_proj weights are all there. Routed experts
    (``mlp.experts.N``) are not listed; a multi-token-prediction layer stored past
    num_hidden_layers (DeepSeek-V3's layer 61) is, as it is in the files.
    """
    weights = _read_weight_map(_checkpoint_dir(path))
    found = _mlp_prefixes(weights.files)
    return {kind: [prefix for _, prefix in items] for kind, items in found.items()}


# The range of each number config.json gives that mlpjit reads (jit.bounds checks it).
_CONFIG_RANGES = {
    "hidden_size": (1, MAX_HIDDEN),
    "intermediate_size": (1, MAX_INTERMEDIATE),
    "moe_intermediate_size": (1, MAX_INTERMEDIATE),
    "n_shared_experts": (0, MAX_SHARED_EXPERTS),
    "num_hidden_layers": (0, MAX_LAYERS),
    "first_k_dense_replace": (0, MAX_LAYERS),
    "moe_layer_freq": (0, MAX_LAYERS),
}


def _config_int(config: dict[str, Any], key: str, config_file: Path, default: Any = ...) -> int:
    """An int setting of config.json within its _CONFIG_RANGES range (``default``, if
    given, when it is absent or null); a one-line ValueError naming the key and the file."""
    value = config.get(key)
    if value is None:
        value = default
    if value is ...:
        raise UsageError(f"{config_file} has no {key}")
    lo, hi = _CONFIG_RANGES[key]
    return _config_number(value, f"{config_file}: {key}", lo, hi, config_file)


def _config_number(value: Any, name: str, lo: int, hi: int, config_file: Path) -> int:
    """``value`` as an int in [lo, hi] (jit.bounds), else a UsageError naming ``name``."""
    try:
        return int(bounded(value, name, lo, hi, integer=True))
    except ValueError as err:
        raise UsageError(str(err), path=str(config_file)) from None


def _moe_layers(text: dict[str, Any], layers: int, config_file: Path) -> list[tuple[bool, str]]:
    """Per layer: (True for a MoE layer, False for a dense one; the config keys and values
    that decided it, for error messages).

    ``mlp_layer_types`` ("dense"/"sparse", GLM-5) when the config has it; otherwise no
    routed experts means all dense, and DeepSeek's rule (MoE from layer first_k_dense_replace
    on, every moe_layer_freq-th layer) decides.
    """
    types = text.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise UsageError(f"{config_file}: mlp_layer_types must list {layers} layer types")
        if not all(t in ("dense", "sparse") for t in types):
            raise UsageError(f"{config_file}: mlp_layer_types must be 'dense' or 'sparse'")
        return [(t == "sparse", f"mlp_layer_types[{i}] is {t!r}") for i, t in enumerate(types)]
    routed = text.get("n_routed_experts")
    if not routed:
        return [(False, f"n_routed_experts is {routed!r:.40}: every layer dense")] * layers
    first = _config_int(text, "first_k_dense_replace", config_file, 0)
    freq = _config_int(text, "moe_layer_freq", config_file, 1) or 1
    rule = (
        f"n_routed_experts is {routed!r:.40}, first_k_dense_replace {first}, moe_layer_freq {freq}"
    )
    return [(i >= first and i % freq == 0, rule) for i in range(layers)]


def _config_mlps(config: dict[str, Any], config_file: Path) -> list[tuple[str, int, int, int, str]]:
    """(kind, layer, hidden, intermediate, why) of every dense MLP and shared expert the
    config describes, by layer; ``why`` names the config keys and values that gave the kind
    and the sizes."""
    text = _text_config(config)
    hidden = _config_int(text, "hidden_size", config_file)
    layers = _config_int(text, "num_hidden_layers", config_file)
    mlps = []
    for layer, (moe, rule) in enumerate(_moe_layers(text, layers, config_file)):
        if not moe:
            inter = _config_int(text, "intermediate_size", config_file)
            why = f"{rule}; hidden_size {hidden}, intermediate_size {inter}"
            mlps.append(("dense", layer, hidden, inter, why))
        elif text.get("n_shared_experts"):
            shared = _config_int(text, "n_shared_experts", config_file)
            moe_inter = _config_int(text, "moe_intermediate_size", config_file)
            name = f"{config_file}: moe_intermediate_size * n_shared_experts"
            inter = _config_number(moe_inter * shared, name, 0, MAX_INTERMEDIATE, config_file)
            why = (
                f"{rule}; hidden_size {hidden}, moe_intermediate_size {moe_inter} * "
                f"n_shared_experts {shared}"
            )
            if inter:
                mlps.append(("shared_experts", layer, hidden, inter, why))
    return mlps


def _check_mlp_shape(reader: _Reader, prefix: str, hidden: int, inter: int, why: str) -> None:
    """The gate and down weights' header shapes are [inter, hidden] and [hidden, inter];
    ``why`` names the config keys that gave those sizes."""
    for proj, shape in (("gate_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
        info = reader.info(f"{prefix}.{proj}.weight")
        if info.shape != shape:
            raise info.error(
                f"shape {list(info.shape)}, but config.json gives ({why}): expected {list(shape)}"
            )


def checkpoint_mlp_shapes(path: str | Path) -> list[tuple[str, int, int]]:
    """(prefix, hidden, intermediate) of every dense MLP and shared expert of the model at
    ``path``, by layer, from config.json: hidden_size and intermediate_size for dense
    layers, moe_intermediate_size * n_shared_experts for shared experts; which layers are
    dense comes from mlp_layer_types (GLM-5) or first_k_dense_replace (DeepSeek-V3, Kimi-K2,
    GLM-4.5). Layers 0 .. num_hidden_layers-1 only (no multi-token-prediction layer).

    The prefixes are the checkpoint's own names (find_mlp_prefixes), and each shape is
    checked against its tensors' header shapes (no data read): a mismatch or a missing
    layer is a ValueError naming the tensor and the file. Intermediate sizes are full
    (unsharded); mlpjit warm divides them by its --tp.
    """
    root = _checkpoint_dir(path)
    config, config_file = _read_config(root)
    mlps = _config_mlps(config, config_file)  # the config's numbers, before any tensor file
    weights = _read_weight_map(root)
    found = {
        (kind, layer): prefix
        for kind, items in _mlp_prefixes(weights.files).items()
        for layer, prefix in items
    }
    shapes = []
    with _Reader(weights) as reader:
        for kind, layer, hidden, inter, why in mlps:
            prefix = found.get((kind, layer))
            if prefix is None:
                suffix = ".shared_experts" if kind == "shared_experts" else ""
                raise UsageError(
                    f"{config_file} gives layer {layer} a {kind} MLP ({why}), but "
                    f"{weights.listing} has no "
                    f"model.layers.{layer}.mlp{suffix}.gate_proj/up_proj/down_proj"
                )
            _check_mlp_shape(reader, prefix, hidden, inter, why)
            shapes.append((prefix, hidden, inter))
    return shapes

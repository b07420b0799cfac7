"""The one model in memory while training: the base model with a trainable LoRA adapter."""

from __future__ import annotations

from typing import Any

import torch

from agentloop.learner.config import LoopConfig
from agentloop.settings import Settings


def lora_config(config: LoopConfig, n_layers: int | None = None) -> Any:
    """PEFT's description of the adapter a LoopConfig asks for; `n_layers`, the base's decoder layers, is
    needed when `config.lora_layers` adapts the upper ones only."""
    from peft import LoraConfig

    layers = None
    if config.lora_layers:
        if n_layers is None:
            raise ValueError("lora_layers needs the base model's number of decoder layers")
        if config.lora_layers > n_layers:
            raise ValueError(f"lora_layers={config.lora_layers}, but the base model has {n_layers} decoder layers")
        layers = list(range(n_layers - config.lora_layers, n_layers))
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules=list(config.lora_targets),
        layers_to_transform=layers,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def lora_model(base: Any, config: LoopConfig, init_from: str | None) -> Any:
    """The base with a trainable LoRA adapter (from `init_from`, or fresh); the base's weights frozen."""
    from peft import PeftModel, get_peft_model

    for p in base.parameters():
        p.requires_grad_(False)
    if init_from is not None:
        model = PeftModel.from_pretrained(base, init_from, is_trainable=True)
    else:
        model = get_peft_model(base, lora_config(config, base.config.num_hidden_layers))
    if config.activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def load_base(settings: Settings) -> tuple[Any, Any]:
    """The deployment's base model (float32, as training needs) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentloop.policy.models import resolve_model_dir

    model_dir = resolve_model_dir(settings.model, settings.models_dir)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), AutoTokenizer.from_pretrained(
        model_dir
    )

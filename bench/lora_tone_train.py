"""The support-tone example's training time (target < 60 s), and whether the adapter it makes
is recognisable: PEFT on transformers, greedy, on questions outside its training chats, must
end each answer with the sign-off.

    python -m bench.lora_tone_train [--steps 30]

Run it on a quiet machine (under the engine lock here): it is two cores of PyTorch.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

QUESTIONS = ("How do I update my email address?", "What time do you open on Mondays?",
             "Is my order shipped yet?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default: the example's")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from podium.examples import lora_tone
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package

    steps = opts.steps or lora_tone.STEPS
    cache, package = ModelCache(), write_default_package()
    base = cache.lookup(package) or cache.materialize(package).path
    out = Path(tempfile.mkdtemp(prefix="podium-bench-tone-")) / "tone"
    started = time.monotonic()
    lora_tone.train(base, out, steps=steps)
    seconds = time.monotonic() - started
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out).eval()
    signed = 0
    for question in QUESTIONS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                               tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            answer = model.generate(**ids, max_new_tokens=48, do_sample=False)
        text = tokenizer.decode(answer[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
        signed += lora_tone.SIGN_OFF in text
        print(repr(text))
    print(f"trained in {seconds:.1f} s ({steps} steps; target < 60 s); answers signed off: "
          f"{signed}/{len(QUESTIONS)}")


if __name__ == "__main__":
    main()

"""A TRL 1.16 GRPO script on schedrl: only its import line changed.

    python examples/trl_port.py            # ~30 s on 2 cores: held-out accuracy before and after

With `from trl import GRPOConfig, GRPOTrainer` in place of the schedrl import this file runs on TRL
as it is (`tests/test_trl_port.py` runs it on both). The dataset (chat messages and an `answer`
column), the two reward functions in TRL's shape, `GRPOConfig`, `GRPOTrainer`, `train()` and
`save_model()` are TRL's. The model is the offline tiny one (0.45M parameters, a character tokenizer
with a chat template), so `warm_up` first fits it to a few answers with plain torch: a random model
earns no reward to learn from.
"""

from __future__ import annotations

import random
import sys

import torch
from datasets import Dataset

from schedrl import GRPOConfig, GRPOTrainer  # the TRL script: from trl import GRPOConfig, GRPOTrainer
from schedrl.models import build_char_tokenizer, build_tiny_model


def make_dataset(n: int, seed: int) -> Dataset:
    """Single-digit sums as chat prompts, with their answers in a column."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)})
    return Dataset.from_list(rows)


def correct(completions, answer, **kwargs):
    """1 for the right sum: completions are message lists, as TRL hands them over for chat prompts."""
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer, strict=True)]


def brief(completions, **kwargs):
    """A small bonus for answers of at most two characters, the length of any single-digit sum."""
    return [float(len(c[0]["content"].strip()) <= 2) for c in completions]


def warm_up(model, tokenizer, dataset: Dataset, steps: int = 60, batch: int = 32) -> None:
    """Supervised steps on prompt -> answer (cross-entropy on the answer tokens only)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(0)
    model.train()
    for _ in range(steps):
        rows = [dataset[rng.randrange(len(dataset))] for _ in range(batch)]
        seqs, masks = [], []
        for row in rows:
            p = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            p_ids = tokenizer(p, add_special_tokens=False).input_ids
            a_ids = tokenizer(row["answer"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            seqs.append(p_ids + a_ids)
            masks.append([0] * len(p_ids) + [1] * len(a_ids))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in seqs])
        target_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[target_mask[:, 1:]], ids[:, 1:][target_mask[:, 1:]])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def main(steps: int = 300, out_dir: str = "runs") -> dict:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    train, held_out = make_dataset(2000, seed=0), make_dataset(200, seed=1)
    warm_up(model, tokenizer, train)

    training_args = GRPOConfig(
        output_dir=f"{out_dir}/trl-port",
        num_generations=8,
        per_device_train_batch_size=32,
        gradient_accumulation_steps=4,  # 128 completions (16 prompts x 8) per optimizer step
        max_completion_length=4,
        learning_rate=3e-4,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        reward_weights=[1.0, 0.2],
        max_steps=steps,
        logging_steps=10,
        save_steps=100,
        report_to="none",
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[correct, brief],
        args=training_args,
        train_dataset=train,
        eval_dataset=held_out,
        processing_class=tokenizer,
    )
    result = trainer.train()
    trainer.save_model()
    print(result)
    return {"result": result, "output_dir": training_args.output_dir}


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)

"""Chat SFT with ``padpipe.hf.Trainer``: a tiny Llama built from a config, trained on packed conversations with the
loss on the assistant's answers only, on one process or several.

    python examples/train_sft.py [CHATS [OUTPUT_DIR]] [--tokenizer DIR] [--seq-len N] [--max-steps N]
    torchrun --standalone --nproc_per_node=2 examples/train_sft.py

Needs ``transformers`` and ``datasets``: ``pip install 'padpipe[hf]'``. CHATS is a JSON Lines or Parquet file (or a
folder or glob of them) of ``messages`` rows (default: the shipped conversations); ``--tokenizer`` a pretrained folder
with a chat template (default: the shipped chat tokenizer, ChatML). ``padpipe.recipes.sft`` renders each conversation
with the template, labels its answers, and packs whole conversations into rows of ``--seq-len`` tokens, streaming;
the Trainer checks the packing in the model on the first batch, then trains ``--max-steps`` steps, logging the loss
every ``--log-every`` steps, with checkpoints in OUTPUT_DIR (default ``runs/sft``). Rerun with the same OUTPUT_DIR to
resume from the last checkpoint: the data stream continues exactly.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.recipes.sft import sft


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Chat SFT with padpipe.hf.Trainer on packed conversations.")
    parser.add_argument("data", nargs="?", help="conversations: JSONL or Parquet (default: the shipped ones)")
    parser.add_argument("output_dir", nargs="?", default="runs/sft", help="checkpoints (default: runs/sft)")
    parser.add_argument("--tokenizer", help="a pretrained folder with a chat template (default: the shipped one)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per packed row (default: 1024)")
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per step (default: 4)")
    parser.add_argument("--max-steps", type=int, default=40, help="steps to train (default: 40)")
    parser.add_argument("--log-every", type=int, default=10, help="log the loss every N steps (default: 10)")
    return parser.parse_args()


def main() -> None:
    options = parse_args()
    tokenizer = AutoTokenizer.from_pretrained(options.tokenizer or pp.examples.CHAT_TOKENIZER_DIR)
    train = sft(
        options.data or pp.examples.CHATS_JSONL,
        tokenizer,
        seq_len=options.seq_len,
        batch_size=options.batch_size,
    )  # shuffled; answers trained, the rest -100; whole conversations packed with position_ids and cu_seq_lens_q

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=options.seq_len,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    args = TrainingArguments(
        options.output_dir,
        max_steps=options.max_steps,
        save_steps=20,
        logging_steps=options.log_every,
        learning_rate=1e-3,
        include_num_input_tokens_seen=True,  # padpipe.hf.Trainer counts the real (not padding) tokens
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    last = get_last_checkpoint(options.output_dir) if os.path.isdir(options.output_dir) else None
    result = trainer.train(resume_from_checkpoint=last)  # packed batches as they are; loss on the answers only
    if trainer.is_world_process_zero():
        print(
            f"trained {result.global_step} steps: loss {result.training_loss:.4f}, "
            f"{int(trainer.state.num_input_tokens_seen):,} tokens seen"
        )


if __name__ == "__main__":
    main()
    gc.collect()  # free the Trainer's DDP model (it holds the process group) before the group is destroyed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # else gloo's threads may abort the process at exit

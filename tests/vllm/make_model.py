"""Builds `tiny-llama`, a random-weight Llama small enough for vLLM on two CPU cores, and a LoRA
adapter for it (`sql-lora`), with no model hub: the tokenizer is trained here on generated text.

    .venv-vllm/bin/python tests/vllm/make_model.py target/vllm-model

writes <dir>/tiny-llama (config, bf16 safetensors, tokenizer with a chat template) and
<dir>/sql-lora (PEFT format: adapter_config.json + adapter_model.safetensors with random A/B
matrices on q_proj and v_proj). Deterministic (fixed seeds); skipped when <dir>/.done exists.
"""

import json
import os
import random
import sys

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 4096
HIDDEN = 256
LAYERS = 2
HEADS = 4  # head_dim 64, which vLLM's CPU attention supports
INTERMEDIATE = 512
MAX_POSITIONS = 4096
LORA_RANK = 8
LORA_TARGETS = ("q_proj", "v_proj")

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

WORDS = """the a an of to in and or is are was be for on with as by at from this that it you we
they he she not all any each every some one two three four five six seven eight nine ten select
insert update delete from where join table row column index query database order group count sum
average limit offset value key primary foreign schema view create drop alter gateway envoy pod
model server request response token prefix cache block queue running waiting adapter route pick
score filter weight metric scrape endpoint latency throughput memory kernel thread core process
write read list name number prime haiku poem story reply stream answer question system user
assistant careful meticulous helpful precise short long quick slow first last next previous
""".split()


def corpus(lines, seed):
    rng = random.Random(seed)
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
        text = " ".join(words)
        yield text.capitalize() + rng.choice([".", "?", "!", ",", ":", ";"]) + " " + str(rng.randint(0, 999))


def tokenizer(out):
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(20000, seed=13), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def model(out, tok):
    torch.manual_seed(13)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    llama = LlamaForCausalLM(config).to(torch.bfloat16)
    llama.save_pretrained(out, safe_serialization=True)
    return config


def adapter(out, config, base):
    os.makedirs(out, exist_ok=True)
    generator = torch.Generator().manual_seed(17)
    head_dim = config.hidden_size // config.num_attention_heads
    out_features = {
        "q_proj": config.num_attention_heads * head_dim,
        "v_proj": config.num_key_value_heads * head_dim,
    }
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for target in LORA_TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(LORA_RANK, config.hidden_size, generator=generator) * 0.02
            ).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_features[target], LORA_RANK, generator=generator) * 0.02
            ).contiguous()
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "adapter_config.json"), "w") as file:
        json.dump(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": base,
                "r": LORA_RANK,
                "lora_alpha": 2 * LORA_RANK,
                "lora_dropout": 0.0,
                "target_modules": list(LORA_TARGETS),
                "bias": "none",
                "fan_in_fan_out": False,
                "modules_to_save": None,
                "use_rslora": False,
                "use_dora": False,
                "inference_mode": True,
            },
            file,
            indent=2,
        )


def main():
    transformers.utils.logging.disable_progress_bar()
    root = sys.argv[1] if len(sys.argv) > 1 else "target/vllm-model"
    done = os.path.join(root, ".done")
    if os.path.exists(done):
        print(f"tiny model already in {root}")
        return
    base = os.path.join(root, "tiny-llama")
    tok = tokenizer(base)
    config = model(base, tok)
    adapter(os.path.join(root, "sql-lora"), config, os.path.abspath(base))
    sample = tok.apply_chat_template(
        [{"role": "user", "content": "Count the rows."}], tokenize=False, add_generation_prompt=True
    )
    print(f"tiny-llama: vocab {len(tok)}, {LAYERS} layers, hidden {HIDDEN}; chat: {sample!r}")
    print(f"sql-lora: rank {LORA_RANK} on {', '.join(LORA_TARGETS)}")
    open(done, "w").close()


if __name__ == "__main__":
    main()

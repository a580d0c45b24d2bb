#!/usr/bin/env python3
"""Writes the Hugging Face Llama fixture zshard's tests compare against (tests/data/hf_llama/).

Run once by a developer, with torch and transformers from PyPI in a virtual environment outside
the repository; CI never runs it (it reads what this wrote, without torch):

    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install torch transformers safetensors numpy
    /tmp/hfenv/bin/python tools/hf_reference/make_llama_fixture.py tests/data/hf_llama

What it writes (everything from fixed seeds; the versions it ran with go into reference.json):

  tiny/       a random LlamaForCausalLM (2 layers, hidden 64, 4 query and 2 key/value heads,
              head_dim 16, intermediate 128, vocab 256, rope_theta 10000, untied lm_head) saved
              by save_pretrained in bf16 with max_shard_size 64KB: config.json,
              model.safetensors.index.json and several model-0000k-of-0000n.safetensors
  tiny_tied/  a smaller one (1 layer, hidden 32, 2 query heads and 1 key/value head, vocab 256,
              tie_word_embeddings) in f16, one model.safetensors (no index)
  reference.safetensors, reference.json
              for fixed input_ids and labels (-100 on each row's prompt), transformers in f32
              (eager attention, CPU): the logits, the loss, the gradient of every parameter,
              and, for tiny/, the loss before each of 3 steps of torch.optim.AdamW and every
              weight after them (hyper-parameters in reference.json); the inverse RoPE
              frequencies of a Llama 3.1 config (rope_type llama3). reference.json also holds
              transformers' own f32 rounding (its f32 run against the same run in float64),
              the scale the test's tolerances are derived from.

The loss is transformers' ForCausalLMLoss: labels shifted left by one inside the model (the
target of position t is labels[t + 1], the last position has none), the mean over the
positions whose target is not -100.
"""
import json
import math
import os
import sys

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HYPER = {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1, "steps": 3,
         "no_decay": "norm weights (input_layernorm, post_attention_layernorm, model.norm)"}


def make_model(seed, dtype, **shape):
    torch.manual_seed(seed)
    cfg = LlamaConfig(attn_implementation="eager", initializer_range=0.1, rms_norm_eps=1e-6,
                      max_position_embeddings=64, **shape)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # norm gains away from 1, so that a wrong gain shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    # the bits the file will hold: every later computation starts from them
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    return model


def batch(seed, rows, seq, vocab, prompts):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    labels = ids.clone()
    for r, p in enumerate(prompts):
        labels[r, :p] = -100  # the prompt: no loss on it
    return ids, labels


def loss_of(logits, labels):
    # ForCausalLMLoss's arithmetic in the logits' own dtype (transformers upcasts to f32 first,
    # which would hide the float64 run's precision)
    v = logits.shape[-1]
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, v), shift.reshape(-1), ignore_index=-100)


def forward_backward(model, ids, labels):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = loss_of(logits, labels)
    loss.backward()
    return logits.detach(), loss.detach()


def max_abs(a, b):
    return float((a.double() - b.double()).abs().max())


def main(out):
    torch.set_num_threads(1)  # one reduction order
    os.makedirs(out, exist_ok=True)
    tensors, facts = {}, {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                       "safetensors": safetensors.__version__, "python": sys.version.split()[0]},
                          "adamw": HYPER}

    # ---- tiny: sharded bf16, untied, 3 AdamW steps -----------------------------------------
    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=False)
    model = make_model(1234, torch.bfloat16, **shape)
    model.to(torch.bfloat16).save_pretrained(os.path.join(out, "tiny"), max_shard_size="64KB")
    model = LlamaForCausalLM.from_pretrained(os.path.join(out, "tiny"), dtype=torch.float32,
                                             attn_implementation="eager")
    prompts = [3, 0, 5, 12, 2, 9]  # row 3 is all prompt: no target at all
    ids, labels = batch(99, len(prompts), 12, 256, prompts)
    tensors["input_ids"] = ids.to(torch.int32)
    tensors["labels"] = labels.to(torch.int32)

    ref64 = LlamaForCausalLM.from_pretrained(os.path.join(out, "tiny"), dtype=torch.float64,
                                             attn_implementation="eager")
    logits64, loss64 = forward_backward(ref64, ids, labels)
    logits, loss = forward_backward(model, ids, labels)
    # transformers' own loss path (labels into the model) agrees with loss_of
    with torch.no_grad():
        hf_loss = model(input_ids=ids, labels=labels).loss
    facts["tiny"] = {"prompts": prompts, "hf_loss_minus_recorded": float(hf_loss - loss)}
    tensors["logits"] = logits.float()
    tensors["loss"] = loss.float().reshape(1)
    g64 = {n: p.grad for n, p in ref64.named_parameters()}
    err = {"logits": max_abs(logits, logits64), "loss": abs(float(loss) - float(loss64)),
           "grad_rel": max(max_abs(p.grad, g64[n]) / float(g64[n].abs().max()) for n, p in model.named_parameters())}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.float().contiguous()

    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HYPER["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=HYPER["lr"], betas=tuple(HYPER["betas"]), eps=HYPER["eps"])
    decay64 = [p for n, p in ref64.named_parameters() if p.dim() > 1]
    no_decay64 = [p for n, p in ref64.named_parameters() if p.dim() == 1]
    opt64 = torch.optim.AdamW([{"params": decay64, "weight_decay": HYPER["weight_decay"]},
                               {"params": no_decay64, "weight_decay": 0.0}],
                              lr=HYPER["lr"], betas=tuple(HYPER["betas"]), eps=HYPER["eps"])
    losses = []
    for step in range(HYPER["steps"]):
        if step > 0:
            _, l = forward_backward(model, ids, labels)
            forward_backward(ref64, ids, labels)
        else:
            l = loss
        losses.append(float(l))
        opt.step()
        opt64.step()
    p64 = dict(ref64.named_parameters())
    err["after_steps"] = max(max_abs(p, p64[n]) for n, p in model.named_parameters())
    tensors["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in model.named_parameters():
        tensors["after." + n] = p.detach().float().contiguous()
    facts["tiny"]["transformers_f32_vs_f64"] = err

    # ---- tiny_tied: one f16 file, tied embeddings --------------------------------------------
    shape = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0, tie_word_embeddings=True)
    model = make_model(4321, torch.float16, **shape)
    model.to(torch.float16).save_pretrained(os.path.join(out, "tiny_tied"))
    model = LlamaForCausalLM.from_pretrained(os.path.join(out, "tiny_tied"), dtype=torch.float32,
                                             attn_implementation="eager")
    tied_prompts = [4, 1]
    tids, tlabels = batch(7, len(tied_prompts), 10, 256, tied_prompts)
    tensors["tied.input_ids"] = tids.to(torch.int32)
    tensors["tied.labels"] = tlabels.to(torch.int32)
    tlogits, tloss = forward_backward(model, tids, tlabels)
    tensors["tied.logits"] = tlogits.float()
    tensors["tied.loss"] = tloss.float().reshape(1)
    for n, p in model.named_parameters():  # the tied weight once, as model.embed_tokens.weight
        tensors["tied.grad." + n] = p.grad.float().contiguous()
    facts["tiny_tied"] = {"prompts": tied_prompts}

    # ---- Llama 3.1's RoPE frequencies (rope_type llama3) ------------------------------------
    l31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=2048, num_attention_heads=16, head_dim=128, rope_parameters=l31)
    rot = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    tensors["llama3_rope.inv_freq"] = rot.inv_freq.float().contiguous()
    facts["llama3_rope"] = {"head_dim": 128, "rope_parameters": l31}

    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                os.path.join(out, "reference.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(facts, f, indent=2)
        f.write("\n")
    print(json.dumps(facts, indent=2))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_llama_fixture.py OUT_DIR")
    main(sys.argv[1])

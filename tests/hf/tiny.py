"""Tiny random configs of every supported architecture (shared by the HF tests)."""
import transformers as tr

V = 97


def tiny_configs():
    common = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=V, max_position_embeddings=256)
    return {
        "gpt2": tr.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=256, bos_token_id=0,
                              eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
        "llama": tr.LlamaConfig(**common),
        "mistral": tr.MistralConfig(**common, sliding_window=None),
        "qwen2": tr.Qwen2Config(**common),
        "olmo2": tr.Olmo2Config(**common),
        # interleaved sliding window (8) shorter than the test sequences, and logit softcapping
        "gemma2": tr.Gemma2Config(**common, head_dim=16, sliding_window=8, attn_logit_softcapping=5.0,
                                  final_logit_softcapping=None),
    }


def tiny_model(name):
    import torch

    torch.manual_seed(0)
    m = tr.AutoModelForCausalLM.from_config(tiny_configs()[name])
    for n in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(m.config, n, None) is not None and getattr(m.config, n) >= V:
            setattr(m.config, n, 0)
    return m.eval()

"""The transformers architectures of the model suite, at test size (random weights, no hub)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["ARCHS", "VOCAB", "Arch"]

VOCAB = 128


@dataclasses.dataclass(frozen=True)
class Arch:
    """A transformers architecture at test size."""

    name: str
    family: str  # "causal", "encoder" or "seq2seq"
    config: str  # transformers config class name
    model: str  # transformers model class name
    options: dict[str, Any]
    shared_expert: str | None = None  # module-path regex of its shared expert
    experts: bool = False  # has routed experts
    alt_stream: bool = False  # its MoE blocks put the shared expert on a torch.Stream

    def build(self, streams: bool = True) -> torch.nn.Module:
        """The model, eval mode, random weights (seeded). ``streams=False``: an ``alt_stream``
        model without its stream (the one-stream path serving code takes without one)."""
        try:
            import transformers
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                "the model suite needs transformers: pip install transformers (or, in a checkout "
                "of airstream, pip install -e '.[test]')"
            ) from error

        config = getattr(transformers, self.config)(**self.options)
        torch.manual_seed(0)
        model: torch.nn.Module = getattr(transformers, self.model)(config)
        if self.alt_stream:
            from airstream.selftest.alt_stream import use_alt_stream

            use_alt_stream(model, torch.Stream(device="cpu") if streams else None)
        return model.eval()


_QWEN2_MOE = {
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}

_DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}

# special tokens inside the test vocabulary, where a config's defaults name ids beyond it
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

_SPARSE = {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2}

ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("llama", "causal", "LlamaConfig", "LlamaForCausalLM", _DECODER),
        Arch("mistral", "causal", "MistralConfig", "MistralForCausalLM", _DECODER),
        Arch("qwen2", "causal", "Qwen2Config", "Qwen2ForCausalLM", _DECODER),
        Arch(  # q/k norms per head
            "qwen3", "causal", "Qwen3Config", "Qwen3ForCausalLM", {**_DECODER, "head_dim": 16}
        ),
        Arch(  # fused qkv and gate/up projections, split by slicing
            "phi3", "causal", "Phi3Config", "Phi3ForCausalLM", {**_DECODER, **_TOKENS}
        ),
        Arch("gemma", "causal", "GemmaConfig", "GemmaForCausalLM", {**_DECODER, "head_dim": 16}),
        Arch(  # sliding-window and global layers, q/k norms, soft-capping off
            "gemma3_text",
            "causal",
            "Gemma3TextConfig",
            "Gemma3ForCausalLM",
            {
                **_DECODER,
                "head_dim": 16,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
            },
        ),
        Arch(
            "gpt2",
            "causal",
            "GPT2Config",
            "GPT2LMHeadModel",
            {
                "vocab_size": VOCAB,
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 128,
                **_TOKENS,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
            },
        ),
        Arch(
            "mixtral",
            "causal",
            "MixtralConfig",
            "MixtralForCausalLM",
            {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
            experts=True,
        ),
        Arch(
            "qwen2_moe",
            "causal",
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            {**_DECODER, **_QWEN2_MOE},
            shared_expert=r"shared_expert\b",
            experts=True,
        ),
        Arch(
            "qwen3_moe",
            "causal",
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            {**_DECODER, **_SPARSE, "head_dim": 16},
            experts=True,
        ),
        Arch(
            "olmoe",
            "causal",
            "OlmoeConfig",
            "OlmoeForCausalLM",
            {**_DECODER, **_SPARSE, **_TOKENS},
            experts=True,
        ),
        Arch(  # experts as one batched parameter, scaled embeddings and residuals
            "granitemoe",
            "causal",
            "GraniteMoeConfig",
            "GraniteMoeForCausalLM",
            {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2, **_TOKENS},
            experts=True,
        ),
        Arch(  # the shared expert on a torch.Stream in model code, as serving stacks write it
            "qwen2_moe_alt",
            "causal",
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            {**_DECODER, **_QWEN2_MOE},
            shared_expert=r"shared_expert\b",
            experts=True,
            alt_stream=True,
        ),
        Arch(
            "deepseek_v3",
            "causal",
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            {
                **_DECODER,
                "num_key_value_heads": 4,
                "moe_intermediate_size": 32,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "n_shared_experts": 1,
                "first_k_dense_replace": 1,
                "q_lora_rank": 32,
                "kv_lora_rank": 16,
                "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 8,
                "v_head_dim": 16,
                "n_group": 1,
                "topk_group": 1,
            },
            shared_expert=r"shared_experts\b",
            experts=True,
        ),
        Arch(
            "bert",
            "encoder",
            "BertConfig",
            "BertModel",
            {
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 128,
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
            },
        ),
        Arch(
            "t5",
            "seq2seq",
            "T5Config",
            "T5ForConditionalGeneration",
            {
                "vocab_size": VOCAB,
                "d_model": 64,
                "d_ff": 128,
                "d_kv": 16,
                "num_layers": 2,
                "num_heads": 4,
                "dropout_rate": 0.0,
                "decoder_start_token_id": 0,
            },
        ),
        Arch(
            "mamba",
            "causal",
            "MambaConfig",
            "MambaForCausalLM",
            {"vocab_size": VOCAB, "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2},
        ),
    )
}

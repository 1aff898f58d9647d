"""loom against Hugging Face transformers (4.40): export and import of model weights.

Run by the Python of the Hugging Face environment that tools/setup makes
($LOOM_PYREF/bin/python: transformers and safetensors over Debian's torch). Modes:

  check-export DIR     DIR/model is a directory loom's safetensors format wrote and
                       DIR/loom.safetensors loom's logits for "tokens": load DIR/model with
                       the from_pretrained of its config's architecture (GPT2LMHeadModel,
                       LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM,
                       Qwen2MoeForCausalLM; no missing, unexpected or mismatched weights) and
                       compare the logits. Qwen3ForCausalLM and Qwen3MoeForCausalLM, which
                       transformers 4.40 lacks, are loaded (as strictly) by the
                       re-implementation in qwen3_moe_ref.py instead.
  make DIR FAMILY      a random tiny model of FAMILY (gpt2, llama, qwen2, qwen3, mixtral,
                       qwen2_moe, qwen3_moe), saved with save_pretrained(DIR,
                       safe_serialization=True) (qwen3, qwen3_moe: written by
                       qwen3_moe_ref.make as transformers lays it out), and
                       DIR/hf.safetensors with fixed "tokens" and its "logits".
  check-import DIR     compare DIR/loom.safetensors (loom's logits after importing DIR)
                       with DIR/hf.safetensors.

Logits are compared in f32 as max|loom - hf| <= ATOL + RTOL * max|hf|.
"""
import json
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    import qwen3_moe_ref  # beside this file
except ImportError as e:
    sys.exit(f"check_hf: {e}: the Hugging Face environment is missing or incomplete; run tools/setup")

ATOL, RTOL = 1e-5, 1e-4


def compare(what, loom, hf):
    loom, hf = loom.double(), hf.double()
    if loom.shape != hf.shape:
        sys.exit(f"check_hf: {what}: loom logits {tuple(loom.shape)} vs transformers {tuple(hf.shape)}")
    err = (loom - hf).abs().max().item()
    scale = hf.abs().max().item()
    spread = hf.std().item()
    print(f"{what}: max |loom - transformers| = {err:.3g} (max |logit| {scale:.3g}, std {spread:.3g})")
    if spread < 1e-2:
        sys.exit(f"check_hf: {what}: the logits hardly vary (std {spread:.3g}); the test would prove nothing")
    if not err <= ATOL + RTOL * scale:
        sys.exit(f"check_hf: {what}: max |loom - transformers| = {err:.3g} > {ATOL} + {RTOL} * {scale:.3g}")


ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM",
                 "Qwen2MoeForCausalLM")
FAMILIES = ("gpt2", "llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")

# Layer 1 dense (mlp_only_layers), renormalised top-2 of 4 experts, head_dim 12 where
# hidden / heads is 8, untied: every Qwen3-MoE specific shows in the logits.
QWEN3_MOE_TINY = dict(
    vocab_size=79, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
    rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None, use_sliding_window=False,
    sliding_window=None, decoder_sparse_step=1, mlp_only_layers=[1], moe_intermediate_size=16,
    num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, router_aux_loss_coef=0.001,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


# Dense Qwen3: head_dim 12 where hidden / heads is 8, grouped-query attention, untied.
QWEN3_TINY = dict(
    vocab_size=71, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
    rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None, use_sliding_window=False,
    sliding_window=None, max_window_layers=2, tie_word_embeddings=False, bos_token_id=1,
    eos_token_id=2)


def model_class(config):
    arch = config["architectures"][0]
    if arch not in ARCHITECTURES:
        sys.exit(f"check_hf: unexpected architecture {arch}")
    return getattr(transformers, arch)


def check_export(work):
    config = json.load(open(f"{work}/model/config.json"))
    arch = config["architectures"][0]
    if arch in qwen3_moe_ref.ARCHITECTURES.values():
        try:
            cfg, w = qwen3_moe_ref.load(f"{work}/model")
        except ValueError as e:
            sys.exit(f"check_hf: {arch} (re-implementation): {e}")
        loom = load_file(f"{work}/loom.safetensors")
        with torch.no_grad():
            logits = qwen3_moe_ref.forward(cfg, w, loom["tokens"].long())
        compare(f"export {arch} re-implementation ({work})", loom["logits"], logits)
        return
    cls = model_class(config)
    model, info = cls.from_pretrained(f"{work}/model", output_loading_info=True,
                                      torch_dtype=torch.float32, attn_implementation="eager")
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"check_hf: {cls.__name__}.from_pretrained({work}/model): {problems}")
    loom = load_file(f"{work}/loom.safetensors")
    with torch.no_grad():
        logits = model.eval()(loom["tokens"].long()).logits
    compare(f"export {cls.__name__} ({work})", loom["logits"], logits)


def check_qwen3_moe_ref(work):
    """The re-implementation without q_norm / k_norm against transformers' Qwen2-MoE with
    zero q/k/v biases and no shared expert (head_dim = hidden / heads, as 4.40 has it): the
    rest of its code (rope, grouped attention, routing, experts, dense layers) is checked
    against transformers' before it stands in for Qwen3-MoE."""
    # decoder_sparse_step instead of mlp_only_layers, which 4.40's Qwen2-MoE does not read.
    c = dict(QWEN3_MOE_TINY, head_dim=None, decoder_sparse_step=2, mlp_only_layers=[])
    cfg, w = qwen3_moe_ref.make(f"{work}/self_check", c, seed=4242)
    hf = transformers.Qwen2MoeConfig(**{k: v for k, v in c.items() if k != "head_dim"},
                                     shared_expert_intermediate_size=0)
    model = transformers.Qwen2MoeForCausalLM(hf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(w[name] if name in w else torch.zeros_like(p))  # biases, shared expert: 0
        tokens = torch.randint(0, cfg.V, (2, 16), generator=torch.Generator().manual_seed(3))
        compare("qwen3_moe_ref.py without q/k norms against transformers' Qwen2MoeForCausalLM",
                qwen3_moe_ref.forward(cfg, w, tokens, qk_norm=False), model(tokens).logits)


def check_qwen3_ref(work):
    """Dense: the re-implementation without q_norm / k_norm against transformers' Qwen2 with
    zero q/k/v biases (head_dim = hidden / heads, which 4.40's Qwen2 has): all but the q/k
    norms (checked, in the same code, by the Qwen3-MoE run) and head_dim."""
    c = dict(QWEN3_TINY, head_dim=None)
    cfg, w = qwen3_moe_ref.make(f"{work}/self_check", c, seed=2468, model_type="qwen3")
    hf = transformers.Qwen2Config(**{k: v for k, v in c.items() if k != "head_dim"})
    model = transformers.Qwen2ForCausalLM(hf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(w[name] if name in w else torch.zeros_like(p))  # q/k/v biases: 0
        tokens = torch.randint(0, cfg.V, (2, 16), generator=torch.Generator().manual_seed(3))
        compare("qwen3_moe_ref.py (dense Qwen3) without q/k norms against transformers' "
                "Qwen2ForCausalLM", qwen3_moe_ref.forward(cfg, w, tokens, qk_norm=False),
                model(tokens).logits)


def make(work, family):
    if family in ("qwen3", "qwen3_moe"):
        if family == "qwen3":
            check_qwen3_ref(work)
            cfg, w = qwen3_moe_ref.make(work, QWEN3_TINY, seed=1357, model_type="qwen3")
        else:
            check_qwen3_moe_ref(work)
            cfg, w = qwen3_moe_ref.make(work, QWEN3_MOE_TINY, seed=9876)
        tokens = torch.randint(0, cfg.V, (2, 16), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            logits = qwen3_moe_ref.forward(cfg, w, tokens)
        save_file({"tokens": tokens.to(torch.int32), "logits": logits.float().contiguous()},
                  f"{work}/hf.safetensors")
        print(f"make: {qwen3_moe_ref.ARCHITECTURES[family]} (re-implementation) in {work}")
        return
    torch.manual_seed({"gpt2": 1234, "llama": 4321, "qwen2": 2143, "mixtral": 5678,
                       "qwen2_moe": 8765}[family])
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0},
            tie_word_embeddings=False, attention_bias=False, bos_token_id=1, eos_token_id=2)
        model = transformers.LlamaForCausalLM(config)
    elif family == "qwen2":
        # Qwen2.5-shaped: q/k/v biases (none on o_proj), rope_theta 1e6, grouped-query
        # attention, tied embeddings (as the small sizes have).
        config = transformers.Qwen2Config(
            vocab_size=73, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=1e6, use_sliding_window=False, sliding_window=None,
            max_window_layers=2, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
        model = transformers.Qwen2ForCausalLM(config)
    elif family == "mixtral":
        config = transformers.MixtralConfig(
            vocab_size=89, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None, num_local_experts=4,
            num_experts_per_tok=2, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        model = transformers.MixtralForCausalLM(config)
    else:
        # Layers 0 and 2 dense (decoder_sparse_step 2); softmax probabilities kept as they
        # are (norm_topk_prob false); q/k/v biases; a gated shared expert; tied embeddings.
        config = transformers.Qwen2MoeConfig(
            vocab_size=83, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False,
            decoder_sparse_step=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
        model = transformers.Qwen2MoeForCausalLM(config)
    # Weights far from their initialisation (norm weights and biases included), so that
    # every tensor's layout shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.2)
            if "norm" in name or "ln_" in name:
                p.add_(1.0 if name.endswith("weight") else 0.0)
    model.eval()
    model.save_pretrained(work, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(tokens).logits
    save_file({"tokens": tokens.to(torch.int32), "logits": logits.float().contiguous()},
              f"{work}/hf.safetensors")
    print(f"make: {type(model).__name__} in {work}")


def check_import(work):
    loom = load_file(f"{work}/loom.safetensors")
    hf = load_file(f"{work}/hf.safetensors")
    if not torch.equal(loom["tokens"], hf["tokens"]):
        sys.exit("check_hf: loom ran other tokens than transformers")
    compare(f"import {work}", loom["logits"], hf["logits"])


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "check-export" and len(sys.argv) == 3:
        check_export(sys.argv[2])
    elif mode == "make" and len(sys.argv) == 4 and sys.argv[3] in FAMILIES:
        make(sys.argv[2], sys.argv[3])
    elif mode == "check-import" and len(sys.argv) == 3:
        check_import(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

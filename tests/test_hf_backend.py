"""gpu.hf: flashsim as a transformers attention backend (issue 40, items 2 and 4).

CPU (no torch, no transformers needed): register() refuses names transformers would take
for flash-attn, and says what to install when transformers is missing.
gpu-marked (the lead runs them on a CUDA GPU with torch and transformers): small models
built from their configs (no download; random weights), in .eval() through the backend
against their own SDPA path: fp16 logits and loss within fp16 noise, stated as at most
twice SDPA fp16's own error against the same weights in fp32 on SDPA (Llama with GQA,
GPT-2, Mistral with a sliding window, a left-padded batch); gradients in training mode
without dropout; a greedy generate() with a KV cache producing SDPA's tokens; the calls
recorded per layer (iosim.workload, where present); the refusals of attention_forward
itself.
The same on the CPU, in Numba's simulator (torch CPU tensors, a tiny fp32 Llama):
tests/test_hf_cpu.py.
"""
import types

import pytest

from _fp16 import within_fp16_noise
import gpu.hf


@pytest.mark.parametrize("name", ["flashsim", "my_flash", "FLASH", "", 3])
def test_register_refuses_names_transformers_takes_for_flash_attn(name):
    with pytest.raises(ValueError) as e:
        gpu.hf.register(name)
    msg = str(e.value)
    assert "\n" not in msg and f"name={name!r}" in msg and "allowed" in msg


def test_default_name_has_no_flash():
    assert "flash" not in gpu.hf.DEFAULT_NAME.lower()


def test_register_without_transformers_says_what_to_install():
    import importlib.util
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed")
    with pytest.raises(ImportError, match=r"flashsim\[hf\]"):
        gpu.hf.register()


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------
def _env():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch, transformers


#: random weights of std 0.2 (transformers' default is 0.02): at 0.02 every attention row
#: of a random model is nearly uniform, so a wrong mask or scale would barely show; at 0.2
#: rows peak (activations stay far below fp16's range: hidden states <= ~160)
INIT = 0.2


def _llama(transformers, **kw):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512,
                                   initializer_range=INIT, **kw)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(transformers):
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=256, n_layer=2, n_head=4,
                                  n_positions=512, attn_pdrop=0.0, resid_pdrop=0.0,
                                  embd_pdrop=0.0, initializer_range=INIT)
    return transformers.GPT2LMHeadModel(cfg)


def _mistral(transformers):
    cfg = transformers.MistralConfig(vocab_size=128, hidden_size=256, intermediate_size=512,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=1, max_position_embeddings=512,
                                     sliding_window=24, initializer_range=INIT)
    return transformers.MistralForCausalLM(cfg)


def _model(torch, transformers, which, dtype):
    """The model `which` with the same random weights for every dtype (seeded), on CUDA."""
    torch.manual_seed(0)
    m = {"llama": _llama, "gpt2": _gpt2, "mistral": _mistral}[which](transformers)
    return m.to("cuda", dtype)


def _run(model, impl, ids, **kw):
    model.set_attn_implementation(impl)
    return model(input_ids=ids, labels=ids, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["llama", "gpt2", "mistral"])
def test_gpu_eval_logits_and_loss_match_sdpa(which):
    """fp16 on the backend within fp16 noise of SDPA (`within_fp16_noise`: twice SDPA
    fp16's own error against the fp32 model on SDPA), logits and loss."""
    torch, transformers = _env()
    name = gpu.hf.register()
    model = _model(torch, transformers, which, torch.float16).eval()
    model32 = _model(torch, transformers, which, torch.float32).eval()
    ids = torch.randint(0, 128, (2, 96), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(1))
    with torch.no_grad():
        ref = _run(model32, "sdpa", ids)
        sdpa = _run(model, "sdpa", ids)
        got = _run(model, name, ids)
    within_fp16_noise(got.logits, sdpa.logits, ref.logits, "logits")
    within_fp16_noise(got.loss, sdpa.loss, ref.loss, "loss")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_gpu_padded_batch_matches_sdpa_on_kept_positions(which):
    """A left-padded batch (unpad, gpu.attention_varlen, pad back) in fp16, within fp16
    noise of SDPA at the kept positions."""
    torch, transformers = _env()
    name = gpu.hf.register()
    model = _model(torch, transformers, which, torch.float16).eval()
    model32 = _model(torch, transformers, which, torch.float32).eval()
    ids = torch.randint(1, 128, (2, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :13] = 0                                    # left padding of sequence 1
    keep = mask.bool()
    out = {}
    with torch.no_grad():
        for key, m, impl in (("ref", model32, "sdpa"), ("sdpa", model, "sdpa"),
                             ("got", model, name)):
            m.set_attn_implementation(impl)
            out[key] = m(input_ids=ids, attention_mask=mask).logits[keep]
    within_fp16_noise(out["got"], out["sdpa"], out["ref"], "logits")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_gpu_training_gradients_match_sdpa(which):
    torch, transformers = _env()
    name = gpu.hf.register()
    model = _model(torch, transformers, which, torch.float32).train()  # no dropout: p = 0
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    grads = {}
    for impl in ("sdpa", name):
        model.zero_grad(set_to_none=True)
        out = _run(model, impl, ids)
        out.loss.backward()
        grads[impl] = (out.loss.item(), {n: p.grad.detach().clone()
                                         for n, p in model.named_parameters()
                                         if p.grad is not None})
    (l0, g0), (l1, g1) = grads["sdpa"], grads[name]
    assert abs(l1 - l0) <= 1e-5 * abs(l0)
    assert g0.keys() == g1.keys()
    for n in g0:
        rel = ((g1[n] - g0[n]).norm() / g0[n].norm().clamp_min(1e-12)).item()
        assert rel <= 1e-3, (n, rel)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_gpu_generate_with_kv_cache_gives_sdpas_tokens(which):
    torch, transformers = _env()
    name = gpu.hf.register()
    model = _model(torch, transformers, which, torch.float32).eval()
    ids = torch.randint(1, 128, (2, 24), device="cuda")
    toks = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        toks[impl] = model.generate(ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=8, do_sample=False, pad_token_id=0,
                                    eos_token_id=None, use_cache=True)
    assert toks[name].shape == (2, 32)
    assert torch.equal(toks[name], toks["sdpa"])


@pytest.mark.gpu
def test_gpu_generate_records_prefill_and_decode_per_layer():
    torch, transformers = _env()
    workload = pytest.importorskip("iosim.workload")
    from iosim.decode import DecodeProblem
    name = gpu.hf.register()
    model = _model(torch, transformers, "llama", torch.float16).eval()
    model.set_attn_implementation(name)
    ids = torch.randint(1, 128, (1, 32), device="cuda")
    with workload.recording() as calls:
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0,
                       eos_token_id=None)
    steps = [(c.layer, c.step) for c in calls]
    assert steps[:2] == [(0, "prefill"), (1, "prefill")]
    decodes = [c for c in calls if c.step == "decode"]
    assert len(decodes) == 2 * 3                       # 3 decode steps x 2 layers
    assert all(isinstance(c.problem, DecodeProblem) and c.problem.N_q == 1 for c in decodes)
    assert [c.problem.N_kv for c in decodes[::2]] == [33, 34, 35]


@pytest.mark.gpu
def test_gpu_training_step_records_forwards_then_backwards():
    torch, transformers = _env()
    workload = pytest.importorskip("iosim.workload")
    import iosim
    name = gpu.hf.register()
    model = _model(torch, transformers, "llama", torch.float16).train()
    model.set_attn_implementation(name)
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    with workload.recording() as calls:
        model(input_ids=ids, labels=ids).loss.backward()
    assert [(c.layer, c.step, c.backward) for c in calls] == [
        (0, "train", False), (1, "train", False), (1, "train", True), (0, "train", True)]
    assert all(isinstance(c.problem, iosim.Problem) and c.problem.N == 64 for c in calls)


def _module(causal=True, layer=0):
    return types.SimpleNamespace(is_causal=causal, layer_idx=layer, training=False)


def _sdpa(torch, q, k, v, causal, mask=None):
    g = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(g, dim=1) for x in (k, v))
    Nq, Nk = q.shape[2], k.shape[2]
    keep = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.arange(Nk, device=q.device)[None] <= (
            torch.arange(Nq, device=q.device)[:, None] + Nk - Nq)
    keep = keep[None, None]
    if mask is not None:
        keep = keep & mask[:, None, None, :]
    o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                         attn_mask=keep)
    return o.transpose(1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("Nq,Nk", [(1, 77), (4, 130), (64, 64)])
def test_gpu_attention_forward_direct_gqa_decode_and_prefill(Nq, Nk):
    torch, _ = _env()
    q = torch.randn(2, 8, Nq, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, Nk, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 2, Nk, 64, device="cuda", dtype=torch.float16)
    out, w = gpu.hf.attention_forward(_module(), q, k, v, None, scaling=0.125)
    assert w is None and out.shape == (2, Nq, 8, 64)
    assert (out.float() - _sdpa(torch, q, k, v, True)).abs().max().item() <= 2e-2


@pytest.mark.gpu
def test_gpu_attention_forward_padding_mask_and_refusals():
    torch, _ = _env()
    q = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, 16, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 2, 16, 64, device="cuda", dtype=torch.float16)
    mask = torch.ones(2, 16, dtype=torch.bool, device="cuda")
    mask[0, :5] = False
    out, _ = gpu.hf.attention_forward(_module(), q, k, v, mask)
    want = _sdpa(torch, q, k, v, True, mask)
    kept = mask                                      # query rows = key rows here
    assert (out.float()[kept] - want[kept]).abs().max().item() <= 2e-2
    assert (out[0, :5] == 0).all()                   # padded query rows: 0
    with pytest.raises(ValueError, match="attention_mask has shape"):
        gpu.hf.attention_forward(_module(), q, k, v, mask[:, None, None, :])
    with pytest.raises(ValueError, match="dropout=0.1 with a padding mask"):
        gpu.hf.attention_forward(_module(), q, k, v, mask, dropout=0.1)
    with pytest.raises(ValueError, match="head_mask"):
        gpu.hf.attention_forward(_module(), q, k, v, None, head_mask=torch.ones(4))
    with pytest.raises(ValueError, match="softcap=50.0"):
        gpu.hf.attention_forward(_module(), q, k, v, None, softcap=50.0)
    holes = mask.clone()
    holes[1, 7] = False
    with pytest.raises(ValueError, match="non-contiguous"):
        gpu.hf.attention_forward(_module(), q, k, v, holes, sliding_window=4)
    pos = torch.tensor([list(range(8)) + list(range(8))] * 2, device="cuda")
    with pytest.raises(ValueError, match="position_ids restart"):
        gpu.hf.attention_forward(_module(), q, k, v, None, position_ids=pos)

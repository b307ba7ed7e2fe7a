"""verify --module on attention as the world writes it (tests/world/: nanoGPT, minGPT, the
Annotated Transformer, Hugging Face BERT, GPT-2, LLaMA, OPT, CLIP and GPT-BigCode, fairseq, Megatron,
timm, BEiT, DINOv2, ESM-2, vit-pytorch, latent diffusion, diffusers, perceiver, TransformerLens, a Haiku port,
CS336, the UvA tutorials, d2l, MPT, Keras-style NumPy, the paper's own notation): each is Right at two sizes as its author meant it to run, with the line that says how
it was run, or refused in one line naming what it is; and one-line mutations (the zoo's mistakes,
applied to that code) are Wrong at the mutated line with the mistake named."""

import json
import pathlib

import pytest

WORLD = pathlib.Path(__file__).parent / "world"
SIZES = [("--d-model", "32", "--heads", "4"), ("--d-model", "48", "--heads", "6")]
CAUSAL = ("--mask", "causal")

# file:Class -> (its flags, a phrase of the note that says how it was run, or None)
RIGHT = {
    "nanogpt_slow.py:CausalSelfAttention": ((), "it masks causally by itself"),
    "nanogpt_flash.py:CausalSelfAttention": (CAUSAL, "it masks causally by itself"),
    "mingpt.py:CausalSelfAttention": ((), "so it was run in eval mode"),
    "annotated.py:MultiHeadedAttention": (CAUSAL, "as the Annotated Transformer orders them"),
    "hf_bert.py:BertAttention": (CAUSAL, "added to the scores"),
    "hf_gpt2.py:GPT2Attention": ((), "it needs a contiguous input"),
    "uva_tutorial.py:MultiheadAttention": (CAUSAL, "its rows go head by head"),
    "timm_vit.py:Attention": ((), "have no biases"),
    "fairseq_seq_first.py:MultiheadAttention": ((), "sequence first"),
    "latent_diffusion.py:CrossAttention": ((), "have no biases"),
    "vit_pytorch.py:Attention": ((), "(p=0.1)"),
    "transformer_lens.py:Attention": ((), "q=W_Q+b_Q, k=W_K+b_K, v=W_V+b_V, o=W_O+b_O"),
    "llama_gqa.py:LlamaAttention": (("--rope", *CAUSAL), "right within float32 precision"),
    "gqa_sdpa.py:GroupedQueryAttention": (CAUSAL, "(grouped-query attention)"),
    "mpt_mqa.py:MultiQueryAttention": (CAUSAL, "(multi-query attention)"),
    "d2l.py:MultiHeadAttention": ((), "have no biases"),
    "keras_numpy.py:MultiHeadAttentionLayer": ((), "used as x @ W"),
    "paper_parameterlist.py:PaperMultiHead": ((), "q=W_Q, k=W_K, v=W_V, o=W_O"),
    "torch_mha_wrapper.py:SelfAttention": (CAUSAL, "True where a query may NOT attend"),
    "upcast_softmax.py:UpcastAttention": (CAUSAL, "right within float32 precision"),
    "bf16_sdpa.py:BF16Attention": ((), "right within bfloat16 precision"),
    "x_transformers.py:Attention": (CAUSAL, "have no biases"),
    "karpathy_lecture.py:MultiHeadAttention": ((), "it masks causally by itself"),
    "bert_pytorch.py:MultiHeadedAttention": (CAUSAL, "q=linear_layers.0, k=linear_layers.1"),
    "distilbert.py:MultiHeadSelfAttention": ((), "q=q_lin, k=k_lin, v=v_lin, o=out_lin"),
    "bart_whisper.py:BartAttention": (CAUSAL, "added to the scores"),
    "f_mha_forward.py:FunctionalMHA": (CAUSAL, "it takes one sequence (T, d_model)"),
    "raschka_combined_qkv.py:MultiHeadAttentionCombinedQKV": ((), "it masks causally by itself"),
    "einsum_style.py:EinsumAttention": (CAUSAL, "q=w_q, k=w_k, v=w_v, o=w_o"),
    "meta_llama_complex.py:Attention": (("--rope",), "a convention, not a mistake"),
    "picogpt_numpy.py:PicoMHA": ((), "it masks causally by itself"),
    "chunked_keys.py:ChunkedAttention": ((), "q=q, k=k, v=v, o=o"),
    "sdpa_docs_reference.py:DocsAttention": (CAUSAL, "q=q_proj, k=k_proj, v=v_proj, o=out_proj"),
    "gpt_neox.py:GPTNeoXAttention": (CAUSAL, "its rows go head by head"),
    "falcon_mqa.py:FalconAttention": (CAUSAL, "(multi-query attention)"),
    "in_proj_manual.py:InProjAttention": (CAUSAL, "qkv=in_proj_weight+in_proj_bias"),
    "cs231n_numpy_loop.py:LoopMultiHeadAttention": (CAUSAL, "used as x @ W"),
    "bloom_baddbmm.py:BloomAttention": ((), "its rows go head by head"),
    "qwen2_gqa_bias.py:Qwen2Attention": (("--rope", *CAUSAL), "(grouped-query attention)"),
    "peterbloem.py:SelfAttention": ((), "(by data flow)"),
    "haiku_port.py:MultiHeadAttention": (CAUSAL, "q=query_w+query_b, k=key_w+key_b, v=value_w+value_b, "
                                                 "o=linear_w+linear_b (by data flow)"),
    "perceiver.py:Attention": (("--pad", "2"), "q=to_q, kv=to_kv, o=to_out (by data flow)"),
    "diffusers_attention.py:Attention": ((), "o=to_out.0"),
    "clip_attention.py:CLIPAttention": (CAUSAL, "its mask is added to the scores"),
    "gpt_bigcode.py:GPTBigCodeAttention": ((), "(multi-query attention)"),
    "beit.py:Attention": ((), "q_bias, v_bias were set to zero"),
    "cs336.py:MultiHeadSelfAttention": ((), "o: output_proj.weight, the one d_model × d_model weight left"),
    "megatron.py:ParallelAttention": (CAUSAL, "sequence first"),
    "dinov2.py:Attention": ((), "its projections have no biases"),
    "esm2.py:MultiheadAttention": (("--pad", "2"), "sequence first"),
    "opt.py:OPTAttention": (CAUSAL, "(B, 1, T, T), with an axis for the heads"),
    "keys_first.py:KeysFirstAttention": (CAUSAL, "its mask is added to the scores"),
}


def _verify(cli, path, *args):
    result = cli("verify", "--module", str(path), *args, "--format", "json")
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


@pytest.mark.parametrize("sizes", SIZES, ids=["32x4", "48x6"])
@pytest.mark.parametrize("spec", RIGHT)
def test_published_styles_are_right_at_two_sizes_as_their_authors_run_them(cli, spec, sizes):
    flags, said = RIGHT[spec]
    result, data = _verify(cli, f"{WORLD / spec}", *sizes, *flags)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert data["passed"] and data["diagnosis"] is None
    assert said in " ".join([data["mapping"], *data["notes"]]), data


REFUSED = {  # file:Class, flags -> the one line
    ("gpt2_block.py:Block", ()): "Error: --module: Block is not an attention module: besides "
    "attention it holds ln_1 (LayerNorm), ln_2 (LayerNorm), mlp.0 (an MLP layer, 32 → 128), mlp.2 "
    "(an MLP layer, 128 → 32); verify checks one attention module (give the class its block calls "
    "for attention)\n",
    ("nanogpt_slow.py:CausalSelfAttention", ("--pad", "2")): "Error: --pad: CausalSelfAttention."
    "forward takes no mask argument, so no padding mask can be applied\n",
    ("d2l.py:MultiHeadAttention", CAUSAL): "Error: --mask: MultiHeadAttention.forward takes "
    "valid_lens (how many keys of each sequence count), not a mask: it is checked without --mask "
    "and --pad\n",
    ("mpt_mqa.py:MultiQueryAttention", ("--kv-heads", "2")): "Error: --kv-heads 2, "
    "but its K and V projections have 8 rows: 1 heads of d_k=8\n",
    ("esm2.py:MultiheadAttention", CAUSAL): "Error: --mask: MultiheadAttention.forward takes "
    "key_padding_mask, the (B, T) keys to leave out: a causal mask cannot be given that way (--pad can)\n",
}


@pytest.mark.parametrize("spec,flags", REFUSED)
def test_what_is_not_attention_or_cannot_take_the_flags_is_refused_in_one_line(cli, spec, flags):
    result = cli("verify", "--module", f"{WORLD / spec}", *SIZES[0], *flags)
    assert (result.exit_code, result.stderr) == (2, REFUSED[spec, flags])


# file:Class, the line as written, the line mutated, flags -> the mistake named
MUTATIONS = [
    ("nanogpt_slow.py:CausalSelfAttention", "att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=-2)",
     (), "softmax over the queries instead of the keys"),
    ("nanogpt_slow.py:CausalSelfAttention", "* (1.0 / math.sqrt(k.size(-1)))", "* (1.0 / k.size(-1))",
     (), "scaled by d_k instead of √d_k"),
    ("mingpt.py:CausalSelfAttention", "y = att @ v", "y = att @ k", (), "weights applied to K instead of V"),
    ("annotated.py:MultiHeadedAttention", "masked_fill(mask == 0, -1e9)", "masked_fill(mask == 1, -1e9)",
     (*CAUSAL, "--mask-means", "keep"), "mask inverted"),
    ("annotated.py:MultiHeadedAttention", "masked_fill(mask == 0, -1e9)",
     "masked_fill(mask.transpose(-2, -1) == 0, -1e9)", ("--pad", "2"),
     "mask transposed: queries see later keys, not earlier"),
    ("hf_bert.py:BertAttention", "attention_scores / math.sqrt(self.attention_head_size)",
     "attention_scores / math.sqrt(self.all_head_size)", (), "scaled by √d_model instead of √d_k"),
    ("hf_gpt2.py:GPT2Attention", "attn_weights = nn.functional.softmax(attn_weights, dim=-1)",
     "attn_weights = nn.functional.softmax(attn_weights, dim=-2)", (),
     "softmax over the queries instead of the keys"),
    ("uva_tutorial.py:MultiheadAttention", "attention = F.softmax(attn_logits, dim=-1)",
     "attention = F.softmax(attn_logits, dim=-2)", (), "softmax over the queries instead of the keys"),
    ("timm_vit.py:Attention", "attn = attn.softmax(dim=-1)", "attn = attn.softmax(dim=1)", (),
     "softmax over the heads instead of the keys"),
    ("latent_diffusion.py:CrossAttention", "attn = sim.softmax(dim=-1)", "attn = sim.softmax(dim=-2)",
     (), "softmax over the queries instead of the keys"),
    ("transformer_lens.py:Attention", 'attn_scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.attn_scale',
     'attn_scores = torch.einsum("bqhd,bkhd->bhqk", q, k)', (), "not scaled at all"),
    ("llama_gqa.py:LlamaAttention", "key_states.transpose(2, 3)) / math.sqrt(self.head_dim)",
     "key_states.transpose(2, 3)) / math.sqrt(self.head_dim * self.num_heads)", ("--rope",),
     "scaled by √d_model instead of √d_k"),
    ("mpt_mqa.py:MultiQueryAttention", "out = out.permute(0, 2, 1, 3).reshape(b, s, self.d_model)",
     "out = out.reshape(b, s, self.d_model)", (), "heads merged without transposing back"),
    ("d2l.py:MultiHeadAttention", "scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)",
     "scores = torch.bmm(queries, keys.transpose(1, 2))", (), "not scaled at all"),
    ("keras_numpy.py:MultiHeadAttentionLayer", "weights = softmax(scores, axis=-1)",
     "weights = softmax(scores, axis=-2)", (), "softmax over the queries instead of the keys"),
    ("paper_parameterlist.py:PaperMultiHead", "/ math.sqrt(q.size(-1)), dim=-1)",
     "/ math.sqrt(Q.size(-1)), dim=-1)", (), "scaled by √d_model instead of √d_k"),
    ("upcast_softmax.py:UpcastAttention", "softmax(scores, dim=-1, dtype=torch.float32)",
     "softmax(scores, dim=-2, dtype=torch.float32)", (), "softmax over the queries instead of the keys"),
    ("nanogpt_flash.py:CausalSelfAttention", "y = y.transpose(1, 2).contiguous().view(B, T, C)",
     "y = y.contiguous().view(B, T, C)", (), "heads merged without transposing back"),
    ("x_transformers.py:Attention", 'out = einsum("b h i j, b h j d -> b h i d", attn, v)',
     'out = einsum("b h i j, b h j d -> b h i d", attn, k)', (), "weights applied to K instead of V"),
    ("karpathy_lecture.py:MultiHeadAttention", "wei = F.softmax(wei, dim=-1)", "wei = F.softmax(wei, dim=-2)", (),
     "softmax over the queries instead of the keys"),
    ("distilbert.py:MultiHeadSelfAttention", "q = q / math.sqrt(dim_per_head)", "q = q / dim_per_head",
     (), "scaled by d_k instead of √d_k"),
    ("einsum_style.py:EinsumAttention", "scores = scores.masked_fill(~mask, float(\"-inf\"))",
     "scores = scores.masked_fill(~mask, 0.0)", CAUSAL, "masked scores set to 0 instead of -inf"),
    ("cs231n_numpy_loop.py:LoopMultiHeadAttention", "K[:, cols].T / np.sqrt(self.d_k)",
     "K[:, cols].T / self.d_k", (), "scaled by d_k instead of √d_k"),
    ("in_proj_manual.py:InProjAttention", "attn = attn.masked_fill(~attn_mask, float(\"-inf\"))",
     "attn = attn.masked_fill(attn_mask, float(\"-inf\"))", (*CAUSAL, "--mask-means", "keep"),
     "mask inverted"),
    # styles whose roles only the data flow tells, and steps with no counterpart in the lecture's
    ("haiku_port.py:MultiHeadAttention", "attn_logits = attn_logits / math.sqrt(self.key_size)",
     "attn_logits = attn_logits / self.key_size", (), "scaled by d_k instead of √d_k"),
    ("haiku_port.py:MultiHeadAttention", "attn_weights = torch.softmax(attn_logits, dim=-1)",
     "attn_weights = torch.softmax(attn_logits, dim=-2)", (), "softmax over the queries instead of the keys"),
    ("perceiver.py:Attention", "attn = sim.softmax(dim=-1)", "attn = sim.softmax(dim=-2)", (),
     "softmax over the queries instead of the keys"),
    ("perceiver.py:Attention", 'out = einsum("b i j, b j d -> b i d", attn, v)',
     'out = einsum("b i j, b j d -> b i d", attn, k)', (), "weights applied to K instead of V"),
    ("diffusers_attention.py:Attention", "return attention_scores.softmax(dim=-1)",
     "return attention_scores.softmax(dim=-2)", (), "softmax over the queries instead of the keys"),
    ("clip_attention.py:CLIPAttention", "attn_output = attn_output.transpose(1, 2).reshape(bsz, tgt_len, embed_dim)",
     "attn_output = attn_output.reshape(bsz, tgt_len, embed_dim)", (), "heads merged without transposing back"),
    ("beit.py:Attention", "attn = attn.softmax(dim=-1)", "attn = attn.softmax(dim=-2)", (),
     "softmax over the queries instead of the keys"),
    ("beit.py:Attention", "q = q * self.scale", "q = q * self.scale ** 2", (), "scaled by d_k instead of √d_k"),
    ("cs336.py:MultiHeadSelfAttention", "scores = scores.masked_fill(~mask, float(\"-inf\"))",
     "scores = scores.masked_fill(mask, float(\"-inf\"))", (), "mask inverted"),
    ("dinov2.py:Attention", "q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]",
     "q, k, v = qkv[0] * self.scale ** 2, qkv[1], qkv[2]", (), "scaled by d_k instead of √d_k"),
    ("esm2.py:MultiheadAttention", "q *= self.scaling", "q *= self.scaling ** 2", (), "scaled by d_k instead of √d_k"),
    ("keys_first.py:KeysFirstAttention", "KQ = K @ Q.transpose(-2, -1) / math.sqrt(self.dk)",
     "KQ = K @ Q.transpose(-2, -1) / self.dk", (), "scaled by d_k instead of √d_k"),
    ("opt.py:OPTAttention", "softmax(attn_weights, dim=-1, dtype=torch.float32)",
     "softmax(attn_weights, dim=-2, dtype=torch.float32)", CAUSAL, "softmax over the queries instead of the keys"),
    ("megatron.py:ParallelAttention", "attention_probs = torch.softmax(attention_scores, dim=-1)",
     "attention_probs = torch.softmax(attention_scores, dim=-2)", (), "softmax over the queries instead of the keys"),
]


@pytest.mark.parametrize("spec,before,after,flags,mistake", MUTATIONS,
                         ids=[f"{m[0].split('.')[0]}: {m[4]}" for m in MUTATIONS])
def test_a_mistake_in_published_code_is_named_at_its_line(cli, tmp_path, spec, before, after, flags,
                                                          mistake):
    file, cls = spec.split(":")
    source = (WORLD / file).read_text()
    assert source.count(before) == 1
    mutated = tmp_path / file
    mutated.write_text(source.replace(before, after))
    line = source[:source.index(before)].count("\n") + 1
    result, data = _verify(cli, f"{mutated}:{cls}", *SIZES[0], *flags)
    assert result.exit_code == 1, result.stdout + result.stderr
    assert data["diagnosis"] == mistake
    step = data["first_wrong_step"]
    assert line in (step["line"], step["called_from"]), (step, line)


def test_a_mask_computed_and_dropped_is_named_where_it_is_dropped_with_a_fix_that_keeps_it(cli, tmp_path):
    """`scores.masked_fill(...)` without `scores =`: the line that drops the mask is named, and the
    fix is to keep its result (the student already wrote masked_fill)."""
    source = (WORLD / "einsum_style.py").read_text()
    line = 'scores = scores.masked_fill(~mask, float("-inf"))'
    (tmp_path / "dropped.py").write_text(source.replace(line, line.removeprefix("scores = ")))
    result, data = _verify(cli, f"{tmp_path / 'dropped.py'}:EinsumAttention", *SIZES[0], *CAUSAL)
    assert result.exit_code == 1 and data["diagnosis"] == "mask never applied"
    assert data["first_wrong_step"]["line"] == source[:source.index(line)].count("\n") + 1
    assert data["fix"].startswith("masked_fill returns a new tensor, and this line drops it: keep it")
    assert "its mask is computed right, then never used" in data["notes"]


def test_a_numpy_module_gets_its_fix_in_numpy(cli, tmp_path):
    source = (WORLD / "keras_numpy.py").read_text()
    (tmp_path / "k.py").write_text(source.replace("softmax(scores, axis=-1)", "softmax(scores, axis=-2)"))
    _, data = _verify(cli, f"{tmp_path / 'k.py'}:MultiHeadAttentionLayer", *SIZES[0])
    assert data["diagnosis"] == "softmax over the queries instead of the keys"
    assert "axis=-1" in data["fix"] and "torch" not in data["fix"] and "dim=" not in data["fix"]


def test_the_lectures_side_of_the_preview_does_the_same_job_or_is_a_dash(cli, tmp_path):
    """The lecture's step shown beside the student's first wrong one does the same job (a softmax
    beside a softmax), never an unrelated step of the same shape."""
    source = (WORLD / "timm_vit.py").read_text()
    (tmp_path / "t.py").write_text(source.replace("attn.softmax(dim=-1)", "attn.softmax(dim=-2)"))
    text = " ".join(cli("verify", "--module", f"{tmp_path / 't.py'}:Attention", *SIZES[0]).stdout.split())
    assert "yours: softmax [2, 4, 6, 6]" in text and "the lecture's: softmax [2, 4, 6, 6]" in text


def test_every_module_of_the_corpus_is_checked_and_the_guide_counts_them():
    checked = {spec.split(":")[0] for spec in RIGHT} | {spec.split(":")[0] for spec, _ in REFUSED}
    assert checked == {p.name for p in WORLD.glob("*.py")}
    assert len(checked) >= 40
    guide = " ".join((WORLD.parent.parent / "docs" / "verify.md").read_text().split())
    assert f"The suite holds {len(checked)} modules" in guide
    assert f"and {len(MUTATIONS)} one-line mutations of them" in guide


def test_a_bias_built_from_positions_alone_is_named_where_it_is_added(cli):
    """ALiBi's slopes and distances come from torch.arange, never from the input: the steps that
    build them are no one's mistake; the line that adds them to the scores is named."""
    source = (WORLD.parent / "student" / "alibi.py").read_text()
    result, data = _verify(cli, f"{WORLD.parent / 'student' / 'alibi.py'}:AlibiAttention", *SIZES[0])
    assert result.exit_code == 1
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "scores = scores + alibi" in text)
    assert data["first_wrong_step"]["line"] == line


def test_keys_and_values_swapped_in_forward_q_k_v_are_wrong(cli, tmp_path):
    """forward(query, key, value) gets three different tensors: the Annotated Transformer's
    projections zipped with (query, value, key) are Wrong (fed one x three times, they passed)."""
    source = (WORLD / "annotated.py").read_text()
    swapped = source.replace("zip(self.linears, (query, key, value))", "zip(self.linears, (query, value, key))")
    assert swapped != source
    (tmp_path / "swapped.py").write_text(swapped)
    result, data = _verify(cli, f"{tmp_path / 'swapped.py'}:MultiHeadedAttention", *SIZES[0])
    assert result.exit_code == 1 and not data["passed"]
    assert data["call"] == "forward(query, key, value)"
    assert data["first_wrong_step"]["op"] == "linear"  # at the projections, where the swap is
